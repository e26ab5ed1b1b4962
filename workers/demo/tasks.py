"""The demo task set: small Python bug-fix tasks shipped as data under `workers/demo/tasks/<key>/`.

Each task directory holds a tiny package, a stdlib-only unittest file and `task.json`. Everything except
`task.json` and `hidden/` is the task's workspace. `hidden/` holds the hidden evaluation tests, laid out as
they land in the workspace (`hidden/tests/test_<key>_hidden.py` becomes `tests/test_<key>_hidden.py`): the
evaluation copies them in after the agent has finished (Task.eval_files), so the agent can only run the
visible tests (`test_command`), and they test the fix more thoroughly than the visible ones do: some edits
pass the visible tests and fail the hidden ones. `solution` and `decoys` in `task.json` exist only for the
scripted demo model (`workers.demo.policy`); they are never written into a sandbox.

The data directory sits beside this module without an `__init__.py`, so `workers.demo.tasks` stays this
module and the task packages are never importable from the host.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

TASKS_DIR = Path(__file__).with_name("tasks")
DIFFICULTIES = ("easy", "medium", "hard")
_SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}
HIDDEN_DIR = "hidden"


class DemoTaskError(ValueError):
    """A task directory is malformed (missing field, edit that does not apply, unknown difficulty)."""


@dataclass(frozen=True)
class Edit:
    """Exact text replacement: `old` occurs exactly once in `path` and becomes `new`."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class DemoTask:
    key: str
    title: str
    instruction: str
    difficulty: str
    eval_command: str  # the evaluation: the visible tests and the hidden ones
    test_command: str  # the visible tests, the command the agent is expected to run
    eval_timeout_s: float
    setup_commands: list[str]
    files: dict[str, str]  # relative path -> text; the task directory but task.json and hidden/
    eval_files: dict[str, str]  # hidden evaluation files: workspace path -> text (from hidden/)
    solution: list[Edit]
    decoys: list[Edit] = field(default_factory=list)

    @property
    def test_paths(self) -> list[str]:
        return sorted(p for p in self.files if p.startswith("tests/"))

    @property
    def source_paths(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py") and not p.startswith("tests/"))


def load_demo_tasks(directory: Path = TASKS_DIR) -> list[DemoTask]:
    """Every task under `directory`, sorted by key. Raises DemoTaskError on a malformed task."""
    if directory == TASKS_DIR:
        return list(_load_shipped())
    return _load_all(directory)


def get_demo_task(key: str) -> DemoTask:
    for task in _load_shipped():
        if task.key == key:
            return task
    raise KeyError(key)


def apply_edits(files: dict[str, str], edits: list[Edit]) -> dict[str, str]:
    """A copy of `files` with `edits` applied in order. Raises DemoTaskError if an edit does not apply."""
    out = dict(files)
    for edit in edits:
        text = out.get(edit.path)
        if text is None or text.count(edit.old) != 1:
            raise DemoTaskError(f"edit does not apply exactly once to {edit.path}: {edit.old[:60]!r}")
        out[edit.path] = text.replace(edit.old, edit.new, 1)
    return out


def revert(edit: Edit) -> Edit:
    return Edit(path=edit.path, old=edit.new, new=edit.old)


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def match_demo_task(text: str, tasks: list[DemoTask] | None = None) -> DemoTask | None:
    """The demo task that `text` (a prompt) is about: its instruction appears in it (whitespace
    normalised), else its title, else its key as a whole word. None when nothing matches."""
    tasks = list(_load_shipped()) if tasks is None else tasks
    haystack = _normalise(text)
    for probe in (lambda t: _normalise(t.instruction), lambda t: _normalise(t.title)):
        for task in tasks:
            if probe(task) in haystack:
                return task
    for task in tasks:
        if re.search(rf"(?<![\w-]){re.escape(task.key)}(?![\w-])", text):
            return task
    return None


@cache
def _load_shipped() -> tuple[DemoTask, ...]:
    # Shipped tasks never change while the process runs; the policy looks them up on every request.
    return tuple(_load_all(TASKS_DIR))


def _load_all(directory: Path) -> list[DemoTask]:
    dirs = sorted(p for p in directory.iterdir() if (p / "task.json").is_file())
    return [_load_one(d) for d in dirs]


def _load_one(directory: Path) -> DemoTask:
    try:
        meta = json.loads((directory / "task.json").read_text(encoding="utf-8"))
        task = DemoTask(
            key=meta["key"],
            title=meta["title"],
            instruction=meta["instruction"],
            difficulty=meta["difficulty"],
            eval_command=meta["eval_command"],
            test_command=meta["test_command"],
            eval_timeout_s=float(meta["eval_timeout_s"]),
            setup_commands=list(meta.get("setup_commands", [])),
            files=_read_files(directory, skip=HIDDEN_DIR),
            eval_files=_read_files(directory / HIDDEN_DIR) if (directory / HIDDEN_DIR).is_dir() else {},
            solution=[Edit(**e) for e in meta["solution"]],
            decoys=[Edit(**e) for e in meta.get("decoys", [])],
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise DemoTaskError(f"{directory.name}: bad task.json ({exc})") from exc
    _check(task, directory)
    return task


def _read_files(directory: Path, *, skip: str = "") -> dict[str, str]:
    files = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_dir() or rel.as_posix() == "task.json" or _SKIPPED_PARTS & set(rel.parts):
            continue
        if skip and rel.parts[0] == skip:
            continue
        if path.suffix == ".pyc":
            continue
        files[rel.as_posix()] = path.read_text(encoding="utf-8")
    return files


def _check(task: DemoTask, directory: Path) -> None:
    if task.key != directory.name:
        raise DemoTaskError(f"{directory.name}: key {task.key!r} differs from its directory")
    if task.difficulty not in DIFFICULTIES:
        raise DemoTaskError(f"{task.key}: difficulty {task.difficulty!r} not in {DIFFICULTIES}")
    if not task.solution:
        raise DemoTaskError(f"{task.key}: no solution")
    if set(task.eval_files) & set(task.files):
        raise DemoTaskError(f"{task.key}: a hidden file is also a workspace file")
    apply_edits(task.files, task.solution)
    for decoy in task.decoys:
        # The demo policy recovers from a decoy by reverting it and then applying the solution.
        apply_edits(task.files, [decoy, revert(decoy), *task.solution])


def _normalise(text: str) -> str:
    return " ".join(text.split())
