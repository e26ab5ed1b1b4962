"""The shipped demo tasks are real bug-fix tasks: the tests fail as shipped, pass with the solution, and
still fail with each decoy. Each has hidden evaluation tests, which the agent never sees: they fail as
shipped, pass with the solution, and catch a decoy that passes the visible tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from workers.demo.tasks import (
    DIFFICULTIES,
    DemoTask,
    DemoTaskError,
    Edit,
    apply_edits,
    get_demo_task,
    load_demo_tasks,
    match_demo_task,
    write_files,
)

TASKS = load_demo_tasks()
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _eval(task: DemoTask, files: dict[str, str], root: Path) -> subprocess.CompletedProcess[str]:
    """The evaluation as the rollout runner makes it: the workspace, then the hidden files copied in."""
    return _run(task.eval_command, {**files, **task.eval_files}, root, task.eval_timeout_s)


def _visible(task: DemoTask, files: dict[str, str], root: Path) -> subprocess.CompletedProcess[str]:
    """The agent's own test run: the workspace as it is, without the hidden files."""
    return _run(task.test_command, files, root, task.eval_timeout_s)


def _run(command: str, files: dict[str, str], root: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    write_files(root, files)
    return subprocess.run(
        ["bash", "-c", command],
        cwd=root,
        env=SANDBOX_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_set_has_at_least_twelve_tasks_of_every_difficulty():
    assert len(TASKS) >= 12
    assert {t.difficulty for t in TASKS} == set(DIFFICULTIES)
    assert len({t.key for t in TASKS}) == len(TASKS)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_eval_fails_as_shipped_and_passes_with_the_solution(task, tmp_path):
    shipped = _eval(task, task.files, tmp_path / "shipped")
    fixed = _eval(task, apply_edits(task.files, task.solution), tmp_path / "fixed")

    assert shipped.returncode != 0
    assert "FAILED" in shipped.stderr  # failing tests, not a crash before any test ran
    assert fixed.returncode == 0, fixed.stderr
    assert "OK" in fixed.stderr.splitlines()[-1]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_the_visible_tests_fail_as_shipped_and_pass_with_the_solution(task, tmp_path):
    shipped = _visible(task, task.files, tmp_path / "shipped")
    fixed = _visible(task, apply_edits(task.files, task.solution), tmp_path / "fixed")

    assert shipped.returncode != 0 and "FAILED" in shipped.stderr
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_the_hidden_tests_fail_as_shipped_and_pass_with_the_solution(task, tmp_path):
    [hidden] = task.eval_files
    only_hidden = f"python3 -m unittest -q {hidden}"
    shipped = _run(only_hidden, {**task.files, **task.eval_files}, tmp_path / "shipped", task.eval_timeout_s)
    fixed = _run(only_hidden, {**apply_edits(task.files, task.solution), **task.eval_files}, tmp_path / "fixed",
                 task.eval_timeout_s)

    assert hidden.startswith("tests/") and hidden not in task.files
    assert hidden in task.eval_command and hidden not in task.test_command
    assert shipped.returncode != 0 and "FAILED" in shipped.stderr, shipped.stderr
    assert fixed.returncode == 0, fixed.stderr
    assert "Ran 0 tests" not in fixed.stderr


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_a_decoy_passes_the_visible_tests_and_fails_the_hidden_ones(task, tmp_path):
    """An agent's own passing run no longer implies the reward: for every task one plausible wrong edit
    passes the tests the agent can run and still fails the evaluation."""
    overfit = []
    for i, decoy in enumerate(task.decoys):
        files = apply_edits(task.files, [decoy])
        if _visible(task, files, tmp_path / f"visible{i}").returncode == 0:
            overfit.append(_eval(task, files, tmp_path / f"eval{i}").returncode)
    assert overfit and all(code != 0 for code in overfit)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_every_decoy_leaves_the_eval_failing(task, tmp_path):
    assert task.decoys
    for i, decoy in enumerate(task.decoys):
        result = _eval(task, apply_edits(task.files, [decoy]), tmp_path / f"decoy{i}")
        assert result.returncode != 0, f"decoy {i} of {task.key} passes the eval"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.key)
def test_task_files_are_a_workspace_without_the_answer(task):
    assert "task.json" not in task.files
    assert task.test_paths and task.source_paths
    assert task.eval_command.startswith("python3 -m unittest")
    assert task.setup_commands == []
    answer_texts = [e.new for e in task.solution]
    assert not any(new in text for new in answer_texts for text in task.files.values())
    assert not any("__pycache__" in path for path in task.files)


def test_a_task_json_is_the_documented_schema():
    meta = json.loads((Path(__file__).parents[3] / "workers/demo/tasks/slugify/task.json").read_text())
    assert set(meta) == {
        "key",
        "title",
        "instruction",
        "difficulty",
        "test_command",
        "eval_command",
        "eval_timeout_s",
        "setup_commands",
        "solution",
        "decoys",
    }
    assert set(meta["solution"][0]) == {"path", "old", "new"}


def test_apply_edits_refuses_an_edit_that_does_not_match_exactly_once():
    files = {"a.py": "x = 1\nx = 1\n"}
    with pytest.raises(DemoTaskError):
        apply_edits(files, [Edit(path="a.py", old="x = 1", new="x = 2")])
    with pytest.raises(DemoTaskError):
        apply_edits(files, [Edit(path="b.py", old="x", new="y")])
    assert apply_edits({"a.py": "x = 1\n"}, [Edit(path="a.py", old="1", new="2")]) == {"a.py": "x = 2\n"}


def _write_task(root: Path, name: str, **overrides) -> None:
    meta = {
        "key": name,
        "title": "t",
        "instruction": "i",
        "difficulty": "easy",
        "eval_command": "true",
        "test_command": "true",
        "eval_timeout_s": 5,
        "setup_commands": [],
        "decoys": [],
        "solution": [{"path": "m.py", "old": "a", "new": "b"}],
        **overrides,
    }
    (root / name).mkdir()
    (root / name / "m.py").write_text("a\n")
    (root / name / "task.json").write_text(json.dumps(meta))


def test_the_loader_reads_a_task_directory(tmp_path):
    _write_task(tmp_path, "tiny")
    (tmp_path / "tiny" / "__pycache__").mkdir()
    (tmp_path / "tiny" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")

    (tmp_path / "tiny" / "hidden" / "tests").mkdir(parents=True)
    (tmp_path / "tiny" / "hidden" / "tests" / "test_hidden.py").write_text("h\n")

    [task] = load_demo_tasks(tmp_path)

    assert task.key == "tiny"
    assert task.files == {"m.py": "a\n"}
    assert task.eval_files == {"tests/test_hidden.py": "h\n"}
    assert task.solution == [Edit(path="m.py", old="a", new="b")]


@pytest.mark.parametrize(
    "overrides",
    [
        {"key": "other"},
        {"difficulty": "trivial"},
        {"solution": []},
        {"solution": [{"path": "m.py", "old": "zzz", "new": "b"}]},
        {"decoys": [{"path": "missing.py", "old": "a", "new": "b"}]},
        {"solution": [{"path": "m.py", "old": "a"}]},
    ],
)
def test_the_loader_rejects_a_malformed_task(tmp_path, overrides):
    _write_task(tmp_path, "tiny", **overrides)
    with pytest.raises(DemoTaskError):
        load_demo_tasks(tmp_path)


def test_a_prompt_is_matched_to_its_task_by_instruction_title_or_key():
    task = get_demo_task("lru_cache")
    wrapped = "Please fix this:\n\n" + "  ".join(task.instruction.split()) + "\nThanks"

    assert match_demo_task(wrapped) is task
    assert match_demo_task(f"Issue: {task.title}") is task
    assert match_demo_task("work on task lru_cache please") is task
    assert match_demo_task("fix the flaky network test in the billing service") is None
