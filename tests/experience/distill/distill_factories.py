"""Hand-made runs for the distillation tests: small, readable, and exact enough to pin numbers on."""

from __future__ import annotations

from collections.abc import Iterable

from experience.distill.source import SourceRun
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from tests.shared_paths import FIXTURES_DIR

TASK = "Fix parse_date so that it accepts ISO week dates."
SWE_AGENT_FIXTURES = FIXTURES_DIR / "swe-agent"


def command(text: str, output: str = "", exit_code: int | None = 0) -> StepRecord:
    return StepRecord(kind="command", command=text, output=output, exit_code=exit_code)


def model_call(
    response: str, request: list[MessageRecord] | None = None, tokens_in: int | None = None
) -> StepRecord:
    return StepRecord(
        kind="model_call", response_text=response, request_messages=request, tokens_in=tokens_in
    )


def message(role: str, text: str) -> StepRecord:
    return StepRecord(kind="message", text=text, payload={"role": role})


def record(
    steps: Iterable[StepRecord],
    *,
    task_key: str = "acme__dates-1",
    success: bool | None = True,
    reward: float | None = None,
    instruction: str = TASK,
    status: str = "completed",
) -> TrajectoryRecord:
    return TrajectoryRecord(
        source="import",
        source_format="test",
        source_ref=f"test:{task_key}",
        task_key=task_key,
        instruction=instruction,
        task_set="unit",
        status=status,
        success=success,
        reward=reward,
        steps=list(steps),
    )


def source_run(
    trajectory_id: str,
    steps: Iterable[StepRecord] | None = None,
    *,
    curation: str = "",
    is_duplicate: bool = False,
    **record_fields: object,
) -> SourceRun:
    default_steps = [command("pytest tests/test_dates.py", "1 passed", 0)]
    made = record(default_steps if steps is None else steps, **record_fields)  # type: ignore[arg-type]
    return SourceRun(trajectory_id=trajectory_id, record=made, curation=curation, is_duplicate=is_duplicate)


def careful_fix() -> list[StepRecord]:
    """Reproduce, fix, verify, run the suite: every good habit."""
    return [
        command("create reproduce.py", "[File: /repo/reproduce.py (1 lines total)]"),
        command("edit 1:1\nfrom dates import parse_date\nparse_date('2024-W01')\nend_of_edit",
                "[File: /repo/reproduce.py (2 lines total)]"),
        command("python reproduce.py", "Traceback (most recent call last):\nValueError: bad date", 1),
        command("open src/dates.py", "[File: /repo/src/dates.py (80 lines total)]"),
        command("edit 10:12\n    return iso_week(text)\nend_of_edit", "[File: /repo/src/dates.py (81 lines total)]"),
        command("python reproduce.py", "2024-01-01", 0),
        command("pytest", "120 passed in 3.1s", 0),
    ]  # fmt: skip


def broken_fix() -> list[StepRecord]:
    """A failing run: passes its repro once, then an edit breaks things and nothing passes again.

    Steps: 0 open, 1 repro (fails), 2 edit src (change), 3 repro (passes), 4 edit src (change: harmful),
    5 pytest (fails), 6 submit.
    """
    return [
        command("cat src/dates.py", "def parse_date(text): ..."),
        command("python reproduce_issue.py", "Traceback (most recent call last):\nValueError: bad", 1),
        command("sed -i 's/strict=True/strict=False/' src/dates.py", "", 0),
        command("python reproduce_issue.py", "2024-01-01", 0),
        command("sed -i 's/return d/return None/' src/dates.py", "", 0),
        command("pytest tests/test_dates.py", "3 failed, 10 passed", 1),
        command("submit", "diff --git a/src/dates.py b/src/dates.py"),
    ]
