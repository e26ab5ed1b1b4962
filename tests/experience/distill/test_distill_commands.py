import random
import re

import pytest

from experience.distill import commands
from experience.distill.commands import (
    PATCH,
    FileWrite,
    edit_rejected,
    output_shows_failure,
    parse_command,
    parse_tool_call,
    path_role,
    same_file,
    verdict,
)


@pytest.mark.parametrize(
    ("command", "runner", "wide"),
    [
        ("pytest", "pytest", True),
        ("pytest -x -q tests/", "pytest", True),
        ("cd /repo && python -m pytest tests/test_dates.py -q 2>&1 | tail -20", "pytest", False),
        ("pytest -k week tests", "pytest", False),
        ("python3 -W ignore -m pytest tests/test_a.py::test_b", "pytest", False),
        ("python -m unittest discover", "unittest", True),
        ("python -m unittest tests.test_dates", "unittest", False),
        ("./tests/runtests.py --settings=test_sqlite", "django", True),
        ("python tests/runtests.py queries -v 2", "django", False),
        ("python manage.py test", "django", True),
        ("timeout 600 tox -e py311", "tox", True),
        ("go test ./...", "go", True),
        ("npm test", "npm", True),
        ("bash -c 'cd /repo && FOO=1 pytest tests'", "pytest", True),
    ],
)
def test_it_recognises_test_runners_and_whether_they_run_the_whole_suite(command, runner, wide):
    (test,) = parse_command(command).tests

    assert (test.runner, test.wide) == (runner, wide)


@pytest.mark.parametrize(
    ("command", "writes"),
    [
        ("sed -i 's/a/b/' src/x.py tests/test_y.py", [FileWrite("src/x.py"), FileWrite("tests/test_y.py")]),
        ("cat > check.py <<'EOF'\nprint(1) > ignored.py\nEOF", [FileWrite("check.py", created=True)]),
        ("cat >> src/pkg/mod.py << EOF\nx = 1\nEOF", [FileWrite("src/pkg/mod.py")]),
        ("echo done > out.txt", []),
        ("python reproduce.py > /dev/null", []),
        ("git apply fix.diff", [FileWrite(PATCH)]),
        ("git checkout -- src/x.py", [FileWrite("src/x.py")]),
        ("create reproduce.py", [FileWrite("reproduce.py", created=True)]),
        (
            "str_replace_editor str_replace /testbed/src/x.py --old_str a --new_str b",
            [FileWrite("/testbed/src/x.py")],
        ),
        ("str_replace_editor view /testbed/src/x.py", []),
        ("grep -rn parse_date src", []),
    ],
)
def test_it_reads_which_files_a_command_writes(command, writes):
    assert list(parse_command(command).writes) == writes


def test_interface_edits_target_the_open_file_and_scripts_are_reported_by_path():
    edit = parse_command("edit 4:4\n    return None\nend_of_edit")
    opened = parse_command('open "src/dates.py" 120')
    script = parse_command("python reproduce.py --verbose")

    assert edit.edits_open_file and edit.editor and not edit.writes
    assert opened.opens == "src/dates.py"
    assert [(t.runner, t.script) for t in script.tests] == [("script", "reproduce.py")]
    assert parse_command("python -c 'import dates'").tests == ()


def test_structured_tool_calls_read_like_their_shell_and_editor_equivalents():
    editor = parse_tool_call(
        "str_replace_editor", '{"command": "create", "path": "/testbed/repro.py", "file_text": "x"}'
    )
    shell = parse_tool_call("execute_bash", {"command": "pytest tests/test_dates.py"})

    assert editor.writes == (FileWrite("/testbed/repro.py", created=True),)
    assert [(t.runner, t.wide) for t in shell.tests] == [("pytest", False)]
    assert parse_tool_call("browser", {"url": "http://x"}).writes == ()


@pytest.mark.parametrize(
    ("path", "role"),
    [
        ("tests/test_dates.py", "test"),
        ("/repo/src/dates_test.go", "test"),
        ("pkg/conftest.py", "test"),
        ("web/app.spec.ts", "test"),
        ("reproduce_bug.py", "repro"),
        ("/testbed/debug_issue.py", "repro"),
        ("src/dates.py", "source"),
        ("django/views/debug.py", "source"),
        ("docs/usage.rst", "other"),
        ("CHANGELOG", "other"),
    ],
)
def test_file_roles_come_from_the_path(path, role):
    assert path_role(path) == role


def test_a_relative_and_an_absolute_spelling_name_the_same_file():
    assert same_file("reproduce.py", "/repo/reproduce.py")
    assert same_file("./src/a.py", "/testbed/src/a.py")
    assert not same_file("a.py", "/repo/data.py")


def test_verdicts_trust_exit_codes_unless_piped_and_read_outputs_otherwise():
    assert verdict(output="1 failed", exit_code=0, piped=False) is True
    assert verdict(output="FAILED tests/test_a.py::test_x\n1 failed", exit_code=0, piped=True) is False
    assert verdict(output="12 passed in 0.3s", exit_code=None, piped=False) is True
    assert (
        verdict(
            output="Traceback (most recent call last):\n  ...\nKeyError: 'x'", exit_code=None, piped=False
        )
        is False
    )
    assert verdict(output="Ran 3 tests\n\nFAILED (failures=1)", exit_code=None, piped=False) is False
    assert verdict(output="0 failed, 3 passed", exit_code=None, piped=False) is True
    assert verdict(output=None, exit_code=None, piped=False) is None


def test_refused_edits_are_recognised():
    refused = "Your proposed edit has introduced new syntax error(s). Please understand the fixes and retry"

    assert edit_rejected(output=refused, exit_code=None)
    assert edit_rejected(
        output="No replacement was performed, old_str did not appear verbatim", exit_code=None
    )
    assert edit_rejected(output="", exit_code=1)
    assert not edit_rejected(output="[File: /repo/a.py (10 lines total)]", exit_code=None)


def test_a_command_is_parsed_once_and_its_intent_reused():
    first = parse_command("pytest tests/test_cache_once.py -q && sed -i 's/a/b/' src/once.py")

    assert parse_command("pytest tests/test_cache_once.py -q && sed -i 's/a/b/' src/once.py") is first
    assert first.writes == (FileWrite("src/once.py"),) and first.tests[0].runner == "pytest"


@pytest.mark.parametrize(
    "output",
    [
        "",
        "4 passed in 0.12s",
        "1 failed, 3 passed in 0.2s",
        "0 failed",
        "2 errors in 1s",
        "Traceback (most recent call last):\n  File 'a.py'",
        "FAILED tests/test_a.py::test_b - assert 1 == 2",
        "FAIL: test_b (tests.test_a.T)",
        "ERROR: test_c (tests.test_a.T)",
        "  ValueError: bad value",
        "ValueError: bad value",
        "--- FAIL: TestA (0.00s)",
        "test result: FAILED. 1 passed; 1 failed",
        "npm ERR! code 1",
        "bash: foo: command not found",
        "cat: x.py: No such file or directory",
        "an error occurred",
        "Error handling is fine",
        "ok\n" * 500 + "1 failed",
    ],
)
def test_output_shows_failure_is_the_failure_markers_expression(output):
    # The substring hints that skip the expression never skip a match.
    assert output_shows_failure(output) is (commands._FAILURE_MARKERS.search(output) is not None)
    assert output_shows_failure(output) is (FAILURE_MARKERS.search(output) is not None)


# The failure markers as documented: one expression of all of them.
FAILURE_MARKERS = re.compile(
    r"Traceback \(most recent call last\)|\b[1-9]\d* (?:failed|errors?)\b|^FAILED\b|^(?:FAIL|ERROR):"
    r"|^[A-Za-z_.]*(?:Error|Exception): |^--- FAIL|test result: FAILED|^npm ERR!|command not found"
    r"|No such file or directory",
    re.M,
)


def test_output_shows_failure_matches_the_markers_on_random_outputs():
    # Pieces of every marker and of near misses, shuffled into many outputs.
    pieces = [
        "Traceback (most recent call last)", "Traceback (most", "1", "0", "12", "a1", " failed", " error",
        " errors", "s", "FAILED", "FAIL", ":", "ERROR", "--- ", "test result: ", "npm ERR!", "npm ER",
        "Error", "Exception", ": ", "x.y_Z", "command not found", "No such file or directory", "\n", " ",
        "-", "é", "_", "\u0663", "passed",
    ]  # fmt: skip
    chooser = random.Random(3)
    for _ in range(5000):
        output = "".join(chooser.choice(pieces) for _ in range(chooser.randint(0, 12)))
        assert output_shows_failure(output) is (FAILURE_MARKERS.search(output) is not None), output
