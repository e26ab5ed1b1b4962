"""Each way agents edit files and run tests, read by the rubric (rubric-2's forms).

Edits: heredocs (into a file, or a script fed to Python), `sed -i`, `tee`, `cat > file`, `mv` / `cp`,
editor tools (str_replace_editor, file_editor, Claude Code's Edit / Write), OpenHands' run_ipython
helpers, Python one-liners and scripts that write files. Test runs: pytest, python -m pytest, unittest,
tox, make test, python tests/..., a harness's own test tool, and inline Python that calls the project.
"""

import pytest
from distill_factories import command, record

from experience.distill import python_code
from experience.distill.commands import FileWrite, parse_command, parse_tool_call
from experience.distill.rubric import run_labels
from experience.records import StepRecord

HEREDOC_EDIT = """python3 - <<'EOF'
from pathlib import Path

path = Path('dates/calendar_math.py')
text = path.read_text()
old = 'return year % 4 == 0 and year % 100 != 0'
new = 'return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)'
assert text.count(old) == 1, f'expected exactly one match in {path}'
path.write_text(text.replace(old, new))
print('edited', path)
EOF"""


def true_labels(labels):
    return {name for name, value in labels.items() if value}


def test_the_demo_heredoc_edit_then_a_passing_unittest_verifies_the_fix():
    labels = run_labels(
        record(
            [
                command("python3 -m unittest -v tests/test_date_add_months.py", "FAILED (failures=2)", 1),
                command(HEREDOC_EDIT, "edited dates/calendar_math.py\n", 0),
                command(
                    "python3 -m unittest -v tests/test_date_add_months.py", "Ran 6 tests in 0.001s\n\nOK\n", 0
                ),
            ]
        )
    )

    assert true_labels(labels) == {
        "ran_repro_before_fix",
        "edited_source",
        "reran_tests_after_edit",
        "verified_fix",
    }


@pytest.mark.parametrize(
    ("text", "written"),
    [
        (HEREDOC_EDIT, ["dates/calendar_math.py"]),
        ("python - <<EOF\nopen('src/a.py', 'w').write('x = 1')\nEOF", ["src/a.py"]),
        (
            "cd /repo && python3 <<'PY'\nwith open('/repo/src/a.py', 'a') as f:\n    f.write('y')\nPY",
            ["/repo/src/a.py"],
        ),
        ("""python -c "import pathlib; pathlib.Path('src', 'b.py').write_text('')" """, ["src/b.py"]),
        ("cat > src/a.py <<'EOF'\nx = 1\nEOF", ["src/a.py"]),
        ("cat <<EOF > src/a.py\nx = 1\nEOF", ["src/a.py"]),
        ("sed -i 's/a/b/' src/a.py src/b.py", ["src/a.py", "src/b.py"]),
        ("printf 'x = 1\\n' | tee src/a.py", ["src/a.py"]),
        ("mv /workspace/game_2048.py /workspace/2048.py", ["/workspace/2048.py"]),
        ("cp src/a.py src/b.py", ["src/b.py"]),
        ("bash <<EOF\nsed -i 's/a/b/' src/a.py\nEOF", ["src/a.py"]),
    ],
)
def test_shell_and_python_writes_are_edits(text, written):
    assert [write.path for write in parse_command(text).writes] == written


@pytest.mark.parametrize(
    "text",
    [
        "python - <<EOF\nprint(open('src/a.py').read())\nEOF",  # reads only
        "cat <<EOF\nhello\nEOF",  # a heredoc to stdout
        "cp src/a.py src/a.py.bak",  # a backup is no code file
        """python -c "import sys; print(sys.path)" """,
        """python - <<EOF\nfor name in names:\n    open(f'{name}.py', 'w')\nEOF""",  # a path made at run time
    ],
)
def test_commands_that_only_read_or_write_unknowable_paths_write_nothing(text):
    assert parse_command(text).writes == ()


def test_a_heredoc_body_is_content_not_commands():
    intent = parse_command("cat > notes.py <<'EOF'\npytest tests/\nsed -i 's/a/b/' src/a.py\nEOF")

    assert intent.tests == ()
    assert intent.writes == (FileWrite("notes.py", created=True),)


@pytest.mark.parametrize(
    ("name", "arguments", "path"),
    [
        ("str_replace_editor", {"command": "str_replace", "path": "/w/src/a.py"}, "/w/src/a.py"),
        ("file_editor", {"command": "insert", "path": "/w/src/a.py"}, "/w/src/a.py"),
        ("Edit", {"file_path": "/w/src/a.py", "old_string": "a", "new_string": "b"}, "/w/src/a.py"),
        ("MultiEdit", {"file_path": "/w/src/a.py", "edits": []}, "/w/src/a.py"),
        ("Write", {"file_path": "/w/src/a.py", "content": "x"}, "/w/src/a.py"),
        (
            "run_ipython",
            {"code": "edit_file_by_replace('/w/src/App.css', to_replace='a', new_content='b')"},
            "/w/src/App.css",
        ),
        (
            "run_ipython",
            {"code": "print(file_editor(**{'command': 'create', 'path': '/w/a.py', 'file_text': ''}))"},
            "/w/a.py",
        ),
        ("run_ipython", {"code": "with open('LICENSE', 'w') as f:\n    f.write(text)"}, "LICENSE"),
    ],
)
def test_editor_tools_and_ipython_helpers_are_edits(name, arguments, path):
    intent = parse_tool_call(name, arguments)

    assert [write.path for write in intent.writes] == [path]
    assert intent.editor  # their output says when an edit was refused


def test_ipython_that_only_opens_a_file_writes_nothing():
    assert parse_tool_call("run_ipython", {"code": "open_file('/w/src/App.tsx')"}).writes == ()


def tool_step(name: str, arguments: dict) -> StepRecord:
    return StepRecord(
        kind="tool_call",
        tool_calls=[{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}],
    )


def observation(text: str) -> StepRecord:
    return StepRecord(kind="observation", text=text)


@pytest.mark.parametrize(
    "refusal",
    [
        "ERROR:\nParameter `old_str` is required for command: str_replace.",
        "ERROR:\nNo replacement was performed, old_str `x` did not appear verbatim in /w/src/a.c.",
        "[No exact match found in /w/src/App.tsx for\n```\nx\n```\n]",
        "[Your proposed edit has introduced new syntax error(s). Please understand the errors and retry your edit command.]",
        "<tool_use_error>String to replace not found in file.\nString: x</tool_use_error>",  # Claude Code's Edit
    ],
)
def test_edits_the_tool_refused_are_not_edits(refusal):
    edit = tool_step("str_replace_editor", {"command": "str_replace", "path": "/w/src/a.c"})
    ipython = tool_step(
        "run_ipython", {"code": "edit_file_by_replace('/w/src/a.c', to_replace='x', new_content='y')"}
    )

    assert not run_labels(record([edit, observation(refusal)]))["edited_source"]
    assert not run_labels(record([ipython, observation(refusal)]))["edited_source"]
    assert run_labels(record([edit, observation("The file /w/src/a.c has been edited.")]))["edited_source"]


@pytest.mark.parametrize(
    ("text", "runner", "wide"),
    [
        ("pytest", "pytest", True),
        ("python -m pytest tests/test_a.py -q", "pytest", False),
        ("python3 -m unittest -v tests/test_calc_expr.py", "unittest", False),
        ("python -m unittest discover -s tests", "unittest", True),
        ("tox -e py311", "tox", True),
        ("make test", "make", True),
        ("python tests/test_a.py", "script", False),
        ("cd /testbed && python -c 'from src.calc import divide; print(divide(1, 0))'", "inline", False),
        ("python3 - <<'EOF'\nfrom calc import evaluate\nprint(evaluate('10 - 3 - 2'))\nEOF", "inline", False),
    ],
)
def test_test_runs_are_recognised(text, runner, wide):
    (test,) = parse_command(text).tests

    assert (test.runner, test.wide) == (runner, wide)


@pytest.mark.parametrize(
    ("arguments", "wide"),
    [({}, True), ({"path": "tests/test_a.py"}, False), ({"k": "week"}, False)],
)
def test_a_harness_test_tool_is_a_test_run(arguments, wide):
    (test,) = parse_tool_call("run_tests", arguments).tests

    assert (test.runner, test.wide) == ("tool", wide)


@pytest.mark.parametrize(
    "text",
    [
        """python -c "import django; print(django.VERSION)" """,  # no call of the project: exploration
        """python -c "import os; print(os.listdir('.'))" """,  # the standard library only
        HEREDOC_EDIT,  # an edit script, not a reproduction
    ],
)
def test_inline_python_that_does_not_call_the_project_is_not_a_test_run(text):
    assert parse_command(text).tests == ()


def test_an_inline_reproduction_before_and_after_a_sed_fix_earns_the_labels():
    labels = run_labels(
        record(
            [
                command(
                    "python -c 'from src.calc import divide; print(divide(1, 0))'",
                    "ZeroDivisionError: division by zero",
                    1,
                ),
                command(
                    "sed -i 's/a/b/' src/calc.py && python -c 'from src.calc import divide; print(divide(1, 0))'",
                    "None",
                    0,
                ),
            ]
        )
    )

    assert true_labels(labels) == {
        "ran_repro_before_fix",
        "edited_source",
        "reran_tests_after_edit",
        "verified_fix",
    }


def test_a_new_unnamed_file_is_scratch_but_a_named_reproduction_is_a_repro():
    solver = run_labels(
        record([command("cat > solve.py <<EOF\nprint(1)\nEOF"), command("python solve.py", "1", 0)])
    )
    repro = run_labels(
        record([command("cat > reproduce.py <<EOF\nprint(1)\nEOF"), command("python reproduce.py", "1", 0)])
    )
    module = run_labels(
        record(
            [
                StepRecord(
                    kind="command",
                    command="create src/new_module.py",
                    output="[File: src/new_module.py (1 lines total)]",
                )
            ]
        )
    )

    assert true_labels(solver) == set()
    assert true_labels(repro) == {"wrote_repro_test", "ran_repro_before_fix"}
    assert true_labels(module) == set()  # the price of roles from names: a new module is scratch


def test_a_file_under_tests_that_the_task_names_is_the_code_at_issue():
    steps = [
        StepRecord(
            kind="command",
            command="open tests/missing_colon.py",
            output="[File: /r/tests/missing_colon.py (10 lines total)]",
        ),
        StepRecord(
            kind="command",
            command="edit 4:4\ndef division(a, b):\nend_of_edit",
            output="[File: /r/tests/missing_colon.py (10 lines total)]",
        ),
        StepRecord(kind="command", command="python tests/missing_colon.py", output="8.2"),
    ]
    named = run_labels(record(steps, instruction="SyntaxError: I'm running `missing_colon.py` as follows"))
    unnamed = run_labels(record(steps, instruction="Division crashes."))

    assert true_labels(named) == {"edited_source", "reran_tests_after_edit", "verified_fix"}
    assert "edited_only_tests" in true_labels(unnamed) and not unnamed["edited_source"]


def test_a_test_named_file_the_task_names_stays_a_test():
    labels = run_labels(
        record(
            [command("sed -i 's/2/3/' tests/test_dates.py")],
            instruction="The tests are in `tests/test_dates.py`.",
        )
    )

    assert labels["edited_only_tests"] and not labels["edited_source"]


@pytest.mark.parametrize(
    ("code", "paths"),
    [
        ("p = 'a.py'\nopen(p, 'w').write('')", ["a.py"]),
        (
            "from pathlib import Path\nroot = Path('/repo')\n(root / 'src' / 'a.py').write_text('')",
            ["/repo/src/a.py"],
        ),
        ("import shutil\nshutil.copy('a.py', 'b.py')", ["b.py"]),
        ("import os\nos.replace('tmp.py', 'src/a.py')", ["src/a.py"]),
        ("open('a.py', mode='x')", ["a.py"]),
        ("from pathlib import Path\nPath('a.py').open('w')", ["a.py"]),
        ("open('a.py')\nopen('b.py', 'rb')", []),
        ("def broken(:\n    open('a.py', 'w')", []),  # not Python: nothing is claimed
        ("!pip install x\nopen('a.py', 'w')", ["a.py"]),  # an IPython cell's shell line
    ],
)
def test_python_code_writes_are_found_without_running_it(code, paths):
    assert [write.path for write in python_code.files_written(code)] == paths


def test_created_files_are_told_apart_from_edits():
    (created,) = python_code.files_written("create_file('/w/new.py')")
    (edited,) = python_code.files_written(
        "edit_file_by_replace('/w/old.py', to_replace='a', new_content='b')"
    )

    assert created.created and not edited.created
