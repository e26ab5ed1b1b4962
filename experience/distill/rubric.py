"""Process-rubric labels: did the run work the way a careful engineer would?

Two layers. `step_events` reads each step once (in order, because an interface `edit` changes whichever
file is open and a script counts as a reproduction only if the run created it) into what happened: files
written, with their role, and test runs, with their verdict. The detectors below fold those events into a
`RubricState` and read one label each from it. Labels are cumulative and causal: the labels at step i use
steps 0..i only, so they can be features of a value model at that step without leaking the future.

File roles: `test` (test directories and test-named files), `repro` (reproduction-named files: repro*,
reproduce*, debug_*...), `source` (other project files), `other` (documentation) and `scratch` (a new file
the run created that is named neither like a test nor like a reproduction: a CTF solver, a throwaway
check; writing or running one is neither an edit nor a test run). A run that adds a new module with
`create` therefore does not count it as a source edit; that is the price of reading roles from names
alone. One exception reads the task: a file under a test directory that is not named like a test and
that the task's instruction names (`missing_colon.py` in "I'm running `missing_colon.py`") is the code at
issue, so writing it is a source edit.

A test run is a test runner (pytest, unittest, Django's runtests.py / manage.py test, tox, make test, go
test, npm test, a harness's own test tool...), a test/repro file run directly with an interpreter, or
inline Python that calls the project's code (`python -c "from calc import f; f(1)"`). Running a project
file (`python setup.py`) is not a test run. Verdicts come from the exit code when it was recorded and the
command was not piped, else from failure markers in the output (see `commands.verdict`).
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from experience.distill import commands
from experience.distill.decisions import ACTION_KINDS, decision_points, model_tool_calls
from experience.records import StepRecord, TrajectoryRecord

# rubric-2: Python that writes files (heredocs, -c, run_ipython helpers), mv / cp, harness test tools and
# inline reproductions are read; unnamed new files are scratch, not reproductions; refused OpenHands edits.
RUBRIC_VERSION = "rubric-2"


@dataclass(frozen=True)
class Write:
    """An applied write to a file, with the file's role at the time."""

    path: str
    role: str
    created: bool = False


@dataclass(frozen=True)
class TestRun:
    runner: str
    wide: bool
    passed: bool | None


@dataclass(frozen=True)
class StepEvents:
    """What one step did. Non-action steps have no events."""

    writes: tuple[Write, ...] = ()
    test_runs: tuple[TestRun, ...] = ()
    error: bool = False

    @property
    def source_writes(self) -> tuple[Write, ...]:
        return tuple(write for write in self.writes if write.role == "source")

    @property
    def changes(self) -> tuple[Write, ...]:
        """Writes that change the project: source files, and test files that existed before the run."""
        return tuple(w for w in self.writes if w.role == "source" or (w.role == "test" and not w.created))


NO_EVENTS = StepEvents()


# --- reading steps -------------------------------------------------------------------------------------


@dataclass
class _Workspace:
    """What the run has done to its files so far: the open file and the files it created."""

    open_file: str | None = None
    created: dict[str, str] = field(default_factory=dict)  # path -> role
    instruction: str = ""

    @functools.cached_property
    def task_files(self) -> frozenset[str]:
        """Basenames of the files the instruction names: read only when a run writes under tests/."""
        return commands.files_named_in(self.instruction)

    def role_of(self, path: str) -> str | None:
        for created_path, role in self.created.items():
            if commands.same_file(created_path, path):
                return role
        return None

    def record_created(self, path: str, role: str) -> None:
        self.created.setdefault(path, role)


def step_events(record: TrajectoryRecord) -> list[StepEvents]:
    """Events of every step, aligned with `record.steps`."""
    workspace = _Workspace(instruction=record.instruction)
    standalone = _StandaloneCalls(record)
    events: list[StepEvents] = []
    for index, step in enumerate(record.steps):
        intents = _intents(step, index, standalone)
        if intents is None:
            events.append(NO_EVENTS)
            continue
        output = _output_of(record, index)
        events.append(_apply(intents, step, output, workspace))
    return events


class _StandaloneCalls:
    """Model calls with no action step of their own: their tool calls are the only trace of the action.

    Most model calls are followed straight by their action step, which settles it without the run's
    decision points; those are read (once) only for a call that is not."""

    def __init__(self, record: TrajectoryRecord) -> None:
        self._record = record
        self._calls: set[int] | None = None

    def include(self, index: int) -> bool:
        steps = self._record.steps
        if index + 1 < len(steps) and steps[index + 1].kind in ACTION_KINDS:
            return False  # the call's own action follows it
        if self._calls is None:
            self._calls = _standalone_model_calls(self._record)
        return index in self._calls


def _standalone_model_calls(record: TrajectoryRecord) -> set[int]:
    return {d.model_call for d in decision_points(record) if d.model_call is not None and not d.actions}


def _intents(
    step: StepRecord, index: int, standalone: _StandaloneCalls
) -> list[commands.CommandIntent] | None:
    kind = step.kind
    if kind == "command":
        return [commands.parse_command(step.command or "")]
    if kind == "tool_call":
        if step.tool_calls:
            return [_tool_intent(call) for call in step.tool_calls]
        return [commands.parse_command(step.command or "")]
    if kind == "model_call" and standalone.include(index):
        return [_tool_intent(call) for call in model_tool_calls(step)]
    if kind == "file_change":
        return [_diff_intent(step)]
    return None


def _tool_intent(call: dict) -> commands.CommandIntent:
    name, arguments = commands.tool_call_name_and_arguments(call)
    return commands.parse_tool_call(name, arguments)


_DIFF_PATH = re.compile(r"^(?:\+\+\+ b/|diff --git a/\S+ b/)(?P<path>\S+)", re.M)


def _diff_intent(step: StepRecord) -> commands.CommandIntent:
    """A recorded workspace diff: the files it touches (from `payload.path(s)` or the diff headers)."""
    paths = [str(p) for p in step.payload.get("paths") or [step.payload.get("path")] if p]
    diff = step.text or str(step.payload.get("diff") or "")
    paths += [m["path"] for m in _DIFF_PATH.finditer(diff) if m["path"] not in paths]
    created = "new file mode" in diff or "--- /dev/null" in diff
    return commands.CommandIntent(
        writes=tuple(commands.FileWrite(p, created=created) for p in dict.fromkeys(paths))
    )


def _output_of(record: TrajectoryRecord, index: int) -> str | None:
    """A step's output: its own, else an observation step right after it (tool harnesses split them)."""
    step = record.steps[index]
    if step.output is not None:
        return step.output
    following = record.steps[index + 1] if index + 1 < len(record.steps) else None
    if (
        step.kind in ("command", "tool_call", "model_call")
        and following is not None
        and following.kind == "observation"
    ):
        return following.text
    return None


def _apply(
    intents: list[commands.CommandIntent], step: StepRecord, output: str | None, workspace: _Workspace
) -> StepEvents:
    writes: list[Write] = []
    runs: list[TestRun] = []
    for intent in intents:
        if intent.writes or intent.edits_open_file:
            writes.extend(_writes(intent, step, output, workspace))
        if intent.opens:
            workspace.open_file = intent.opens
        if intent.tests:
            runs.extend(_test_runs(intent, step, output, workspace))
    error = step.is_error or _failed_exit(step) or commands.output_shows_failure(output)
    if not (writes or runs or error):
        return NO_EVENTS  # most steps: one shared value, which also pickles to a reference
    return StepEvents(writes=tuple(writes), test_runs=tuple(runs), error=error)


def _failed_exit(step: StepRecord) -> bool:
    return step.exit_code is not None and step.exit_code != 0


def _writes(
    intent: commands.CommandIntent, step: StepRecord, output: str | None, workspace: _Workspace
) -> list[Write]:
    if intent.editor and commands.edit_rejected(output=output, exit_code=step.exit_code):
        return []
    targets = list(intent.writes)
    if intent.edits_open_file:
        path = commands.edited_file_from_output(output) or workspace.open_file
        if path:
            targets.append(commands.FileWrite(path))
    return [_classified(target, workspace) for target in targets]


def _classified(target: commands.FileWrite, workspace: _Workspace) -> Write:
    known = workspace.role_of(target.path)
    if known is not None:
        return Write(target.path, known, created=True)
    named = commands.path_role(target.path)
    if named == "test" and _named_by_task(target.path, workspace):
        named = "source"  # the file the issue is about, though it lives under tests/
    if not target.created:
        return Write(target.path, named)
    role = "scratch" if named == "source" else named
    workspace.record_created(target.path, role)
    return Write(target.path, role, created=True)


def _named_by_task(path: str, workspace: _Workspace) -> bool:
    name = posixpath.basename(path)
    return name in workspace.task_files and not commands.named_like_test(name)


def _test_runs(
    intent: commands.CommandIntent, step: StepRecord, output: str | None, workspace: _Workspace
) -> list[TestRun]:
    runs: list[TestRun] = []
    passed = commands.verdict(output=output, exit_code=step.exit_code, piped=intent.piped)
    for test in intent.tests:
        if test.runner == "script":
            role = workspace.role_of(test.script or "") or commands.path_role(test.script or "")
            if role not in ("test", "repro"):
                continue  # running a project file is not a test run
        runs.append(_test_run(test.runner, test.wide, passed))
    return runs


@functools.lru_cache(maxsize=256)
def _test_run(runner: str, wide: bool, passed: bool | None) -> TestRun:
    """One shared TestRun per value: there are few, and shared ones pickle as references."""
    return TestRun(runner, wide, passed)


# --- folding events into labels ------------------------------------------------------------------------


@dataclass(frozen=True)
class RubricState:
    """Counters over steps 0..i; each detector reads one label from it."""

    wrote_test_or_repro: bool = False
    test_file_writes: int = 0
    source_edits: int = 0
    test_runs: int = 0
    passed_test_runs: int = 0
    errors: int = 0
    tested_before_first_edit: bool = False
    tested_since_first_edit: bool = False
    passed_since_last_edit: bool = False
    wide_run: bool = False

    def fold(self, events: StepEvents) -> RubricState:
        """The state after one more step (the same object when the step did nothing). Within a step,
        writes come before test runs (`sed -i ... && pytest` edits, then tests)."""
        if not (events.writes or events.test_runs or events.error):
            return self
        roles = [write.role for write in events.writes]
        source_edits = self.source_edits + roles.count("source")
        edited = source_edits > 0  # when this step's test runs ran
        runs = events.test_runs
        passed = sum(1 for run in runs if run.passed is True)
        return RubricState(
            wrote_test_or_repro=self.wrote_test_or_repro or "test" in roles or "repro" in roles,
            test_file_writes=self.test_file_writes + roles.count("test"),
            source_edits=source_edits,
            test_runs=self.test_runs + len(runs),
            passed_test_runs=self.passed_test_runs + passed,
            errors=self.errors + events.error,
            tested_before_first_edit=self.tested_before_first_edit or (bool(runs) and not edited),
            tested_since_first_edit=self.tested_since_first_edit or (bool(runs) and edited),
            # A source edit in this step unverifies the fix; a run that passes after it verifies it.
            passed_since_last_edit=(self.passed_since_last_edit and source_edits == self.source_edits)
            or (edited and passed > 0),
            wide_run=self.wide_run or any(run.wide for run in runs),
        )


def wrote_repro_test(state: RubricState) -> bool:
    """Wrote a test or reproduction: created a test or a reproduction-named script (other new files are
    scratch), or wrote into a test file."""
    return state.wrote_test_or_repro


def ran_repro_before_fix(state: RubricState) -> bool:
    """Ran a test or a reproduction script at a time when no source file had been edited yet."""
    return state.tested_before_first_edit


def edited_source(state: RubricState) -> bool:
    """Made at least one applied edit to a source file (refused interface edits do not count)."""
    return state.source_edits > 0


def reran_tests_after_edit(state: RubricState) -> bool:
    """Ran a test or reproduction script after its first source edit."""
    return state.tested_since_first_edit


def verified_fix(state: RubricState) -> bool:
    """Edited source, and a test run after the latest source edit passed (exit code 0, or no failure
    marker in its output when no exit code was recorded or the command was piped)."""
    return state.source_edits > 0 and state.passed_since_last_edit


def ran_wider_suite(state: RubricState) -> bool:
    """Ran the whole test suite or a whole test directory at any point: a runner with no file or `-k`
    selection (`pytest`, `pytest tests/`, `python -m unittest discover`, `tox`, `runtests.py` without
    labels, `go test ./...`)."""
    return state.wide_run


def edited_only_tests(state: RubricState) -> bool:
    """Wrote test files but never a source file: the run changed tests instead of fixing code."""
    return state.test_file_writes > 0 and state.source_edits == 0


DETECTORS: dict[str, Callable[[RubricState], bool]] = {
    detector.__name__: detector
    for detector in (
        wrote_repro_test,
        ran_repro_before_fix,
        edited_source,
        reran_tests_after_edit,
        verified_fix,
        ran_wider_suite,
        edited_only_tests,
    )
}
LABELS = tuple(DETECTORS)
_DETECTOR_FUNCTIONS = tuple(DETECTORS.values())


def labels_of(state: RubricState) -> dict[str, bool]:
    return dict(zip(LABELS, _label_values(state), strict=True))


@dataclass(frozen=True)
class Rubric:
    """A run's rubric: events and the state after each step."""

    events: list[StepEvents]
    states: list[RubricState]

    def state_before(self, step_index: int) -> RubricState:
        return self.states[step_index - 1] if step_index > 0 else RubricState()

    def labels_before(self, step_index: int) -> dict[str, bool]:
        """Labels from steps 0..step_index-1: what a model choosing at `step_index` could know."""
        return labels_of(self.state_before(step_index))

    def labels_after(self, step_index: int) -> dict[str, bool]:
        return labels_of(self.states[step_index])

    @property
    def final_state(self) -> RubricState:
        return self.states[-1] if self.states else RubricState()

    @property
    def run_labels(self) -> dict[str, bool]:
        return labels_of(self.final_state)

    def label_changes(self) -> list[tuple[str, bool, int | None]]:
        """(name, final value, the step after which it took that value, or None when it held from the
        start) of each label, in LABELS order: what the store keeps of a run. One pass, reading only the
        states that differ from the step before (an unchanged step hands back the same state)."""
        previous = RubricState()
        values = _label_values(previous)
        changed_at: list[int | None] = [None] * len(values)
        for index, state in enumerate(self.states):
            if state is previous:
                continue
            previous = state
            current = _label_values(state)
            if current != values:
                for position, (before, after) in enumerate(zip(values, current, strict=True)):
                    if before != after:
                        changed_at[position] = index
                values = current
        return list(zip(LABELS, values, changed_at, strict=True))


def _label_values(state: RubricState) -> tuple[bool, ...]:
    return tuple([detector(state) for detector in _DETECTOR_FUNCTIONS])


def rubric(record: TrajectoryRecord) -> Rubric:
    events = step_events(record)
    states: list[RubricState] = []
    state = RubricState()
    for step in events:
        if step is not NO_EVENTS:
            state = state.fold(step)
        states.append(state)
    return Rubric(events=events, states=states)


def per_step_labels(record: TrajectoryRecord) -> list[dict[str, bool]]:
    """Labels after each step (aligned with `record.steps`), for writing back to steps."""
    scored = rubric(record)
    return [labels_of(state) for state in scored.states]


def run_labels(record: TrajectoryRecord) -> dict[str, bool]:
    """Labels of the whole run."""
    return rubric(record).run_labels
