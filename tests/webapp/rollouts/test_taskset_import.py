"""Task sets from SWE-bench-style JSONL: validated line by line before anything is written."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import pytest
from django.core.management import CommandError, call_command

from experience.errors import Conflict
from webapp.rollouts.models import Task, TaskSet
from webapp.rollouts.taskset_import import TaskSetImportError, taskset_import_jsonl

pytestmark = pytest.mark.django_db


def snapshot(files: dict[str, bytes]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, content in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return base64.b64encode(buffer.getvalue()).decode()


def jsonl(*records) -> io.BytesIO:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return io.BytesIO(("\n".join(lines) + "\n").encode())


def swe_task(instance_id: str, **fields) -> dict:
    return {"instance_id": instance_id, "problem_statement": f"Fix {instance_id}.",
            "eval_command": "python -m pytest -q tests", **fields}


def test_a_valid_file_becomes_a_task_set_with_every_field_in_its_place():
    records = [
        swe_task("astropy__astropy-12907", files={"pkg/mod.py": "x = 1\n"}, setup_commands=["pip --version"],
                 success_exit_code=1, eval_timeout_s=120, FAIL_TO_PASS='["tests/test_mod.py::test_x"]',
                 PASS_TO_PASS=["tests/test_mod.py::test_y"], repo="astropy/astropy", base_commit="d16bfe0"),
        swe_task("django__django-11099", snapshot_b64=snapshot({"./app/views.py": b"def view(): pass\n",
                                                                 "README": b"hello\n"}),
                 files={"README": "overridden\n"}),
    ]

    task_set = taskset_import_jsonl(name="swe-mini", fileobj=jsonl(records[0], "", records[1]), description="two")

    assert (task_set.name, task_set.source, task_set.description) == ("swe-mini", "jsonl", "two")
    first, second = task_set.tasks.order_by("key")
    assert first.key == "astropy__astropy-12907" and first.instruction == "Fix astropy__astropy-12907."
    assert first.files == {"pkg/mod.py": "x = 1\n"} and first.setup_commands == ["pip --version"]
    assert (first.success_exit_code, first.eval_timeout_s) == (1, 120)
    assert first.metadata == {"FAIL_TO_PASS": ["tests/test_mod.py::test_x"], "PASS_TO_PASS": ["tests/test_mod.py::test_y"],
                              "repo": "astropy/astropy", "base_commit": "d16bfe0"}
    assert second.files == {"app/views.py": "def view(): pass\n", "README": "overridden\n"}
    assert second.success_exit_code == 0 and second.eval_timeout_s == 60


@pytest.mark.parametrize(("line", "needle"), [
    ({"problem_statement": "p", "eval_command": "true"}, "line 2: field 'instance_id' missing"),
    (swe_task("x", eval_command=None), "line 2: field 'eval_command' missing"),
    (swe_task("x", problem_statement="  "), "line 2: field 'problem_statement' is empty"),
    (swe_task("x", success_exit_code="0"), "line 2: field 'success_exit_code' must be an integer"),
    (swe_task("x", setup_commands="make"), "line 2: field 'setup_commands' must be a list"),
    (swe_task("x", files={"../etc/passwd": "x"}), "line 2: field 'files' path '../etc/passwd' must be relative"),
    (swe_task("x", FAIL_TO_PASS="not json"), "line 2: field 'FAIL_TO_PASS' must be a list"),
    (swe_task("x", snapshot_b64="%%%"), "line 2: field 'snapshot_b64' is not valid base64"),
    (swe_task("x", snapshot_b64=base64.b64encode(b"not a tarball").decode()), "line 2: field 'snapshot_b64' is not a readable"),
    (swe_task("x", snapshot_b64=snapshot({"/abs/path": b"x"})), "line 2: field 'snapshot_b64' path '/abs/path'"),
    (swe_task("x", snapshot_b64=snapshot({"logo.png": b"\x89PNG\xff\xfe"})), "member 'logo.png' is not UTF-8"),
    ('{"instance_id": "x", ', "line 2: is not valid JSON"),
    ('["a list"]', "line 2: must be a JSON object"),
    (swe_task("ok"), "line 2: field 'instance_id' repeats line 1"),
])
def test_a_bad_line_is_named_with_its_field_and_nothing_is_written(line, needle):
    with pytest.raises(TaskSetImportError) as error:
        taskset_import_jsonl(name="bad", fileobj=jsonl(swe_task("ok"), line, swe_task("fine")))

    assert needle in error.value.message
    assert not TaskSet.objects.exists() and not Task.objects.exists()


def test_every_bad_line_is_reported_at_once():
    with pytest.raises(TaskSetImportError) as error:
        taskset_import_jsonl(name="bad", fileobj=jsonl(swe_task("a"), {"instance_id": "b"}, swe_task("c", eval_command=3)))

    assert [str(e) for e in error.value.errors] == [
        "line 2: field 'problem_statement' missing", "line 3: field 'eval_command' must be a string, not int"]
    assert error.value.field == "problem_statement"


def test_an_empty_file_or_a_taken_name_is_refused():
    with pytest.raises(TaskSetImportError, match="the file has no tasks"):
        taskset_import_jsonl(name="empty", fileobj=io.BytesIO(b"\n\n"))
    taskset_import_jsonl(name="taken", fileobj=jsonl(swe_task("a")))
    with pytest.raises(Conflict) as conflict:
        taskset_import_jsonl(name="taken", fileobj=jsonl(swe_task("b")))
    assert conflict.value.field == "name"
    assert list(TaskSet.objects.get(name="taken").tasks.values_list("key", flat=True)) == ["a"]


def test_the_import_tasks_command_imports_a_file(tmp_path, capsys):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(jsonl(swe_task("a"), swe_task("b")).getvalue())

    call_command("import_tasks", "from-cli", str(path))

    assert "Imported 2 tasks as task set 'from-cli'" in capsys.readouterr().out
    assert TaskSet.objects.get(name="from-cli").tasks.count() == 2


def test_the_import_tasks_command_names_each_bad_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(jsonl(swe_task("a"), swe_task("b", eval_command=""), "{").getvalue())

    with pytest.raises(CommandError, match="2 problem"):
        call_command("import_tasks", "from-cli", str(path))

    err = capsys.readouterr().err
    assert "line 2: field 'eval_command' is empty" in err and "line 3: is not valid JSON" in err
    assert not TaskSet.objects.exists()


def test_protected_paths_and_hidden_evaluation_files_are_kept_apart_from_the_workspace():
    hidden = {"tests/test_fail_to_pass.py": "def test_x():\n    assert False\n"}
    records = [swe_task("a", files={"tests/test_a.py": "t\n"}, protected_paths=["tests/", "./conftest.py"],
                        eval_files=hidden),
               swe_task("b")]

    task_set = taskset_import_jsonl(name="hidden", fileobj=jsonl(*records))

    a, b = task_set.tasks.order_by("key")
    assert a.protected_paths == ["tests/", "conftest.py"] and a.eval_files == hidden
    assert "tests/test_fail_to_pass.py" not in a.files and "eval_files" not in a.metadata
    assert b.protected_paths == ["tests/"] and b.eval_files == {}


@pytest.mark.parametrize(("fields", "error"), [
    ({"protected_paths": "tests/"}, "field 'protected_paths' must be a list of relative paths"),
    ({"protected_paths": ["../outside"]}, "field 'protected_paths' path '../outside' must be relative"),
    ({"protected_paths": ["."]}, "field 'protected_paths' path '.' must be relative"),
    ({"eval_files": ["tests/x.py"]}, "field 'eval_files' must be an object of {relative path: text}"),
    ({"eval_files": {"/etc/passwd": "x"}}, "field 'eval_files' path '/etc/passwd' must be relative"),
])
def test_bad_protected_paths_or_eval_files_are_refused_naming_the_field(fields, error):
    with pytest.raises(TaskSetImportError) as caught:
        taskset_import_jsonl(name="bad-hidden", fileobj=jsonl(swe_task("a", **fields)))
    assert error in str(caught.value)
    assert not TaskSet.objects.filter(name="bad-hidden").exists()
