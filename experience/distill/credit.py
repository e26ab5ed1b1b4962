"""Credit-assigned SFT rows: successful runs whole, failed runs only for their useful part.

The harmful step of a failed run (`first_harmful_step`) is found from the recorded actions, outputs and
exit codes, with the rubric's events (applied writes with file roles, test runs with verdicts):

    A "change" is an applied write to a source file or to a test file that existed before the run
    (rewriting tests to pass is as much a change as editing code; new scratch scripts are not).
    Let P be the last test run that passed (None if none did).
    1. The first change after P (after the start when P is None): from there on the run never got back
       to a passing test, so that change began the part that went wrong.
    2. If no change follows P but the run made changes: the first change. The run's own tests passed
       but the task failed, so its fix as a whole was wrong; the exploration before it is kept.
    3. If the run made no change at all: its last action (it ended without a fix; what it read and ran
       before that is kept).
    Successful runs have no harmful step (None).

Modes (`DatasetSpec.sft_mode`):
- `truncate`: the conversation up to the decision holding the harmful step, ending on the last trained
  assistant turn.
- `mask`: the whole conversation; assistant turns of the harmful decision and later get weight 0.

Rows are OpenAI chat messages; every assistant message carries `weight` (1 trained, 0 not), the key
OpenAI's fine-tuning format uses. Only assistant turns a decision produced are trained. A failed run whose harmful step is in its first decision leaves nothing
to train on and gives no row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from experience.distill import chat
from experience.distill.decisions import Decision, decision_at, decision_points
from experience.distill.rubric import rubric
from experience.distill.selection import selected_runs
from experience.distill.source import SourceRun, run_return, run_success, step_label_values
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.records import TrajectoryRecord

CREDIT_VERSION = "harmful-step-1"
Row = dict[str, Any]


def first_harmful_step(record: TrajectoryRecord) -> int | None:
    """Index (into `record.steps`) of the first harmful step of a failed run, by the rule above."""
    if run_success(record):
        return None
    events = rubric(record).events
    last_pass = max((i for i, e in enumerate(events) if any(run.passed for run in e.test_runs)), default=-1)
    changes = [i for i, e in enumerate(events) if e.changes]
    after_pass = [i for i in changes if i > last_pass]
    if after_pass:
        return after_pass[0]
    if changes:
        return changes[0]
    decisions = decision_points(record)
    return decisions[-1].first_step if decisions else None


def sft_rows(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """Credit-assigned SFT rows of the selected runs (streams run by run)."""
    for run in selected_runs(runs, spec):
        row = run_sft_row(run, spec)
        if row is not None:
            yield row


# A curator's label that ends a run's trained prefix at the step it marks, whatever the run's outcome.
PREFIX_ENDING_LABELS = ("wrong-tool",)


def labelled_harmful_step(run: SourceRun) -> int | None:
    """The first step a curator labelled as ending the trained prefix (PREFIX_ENDING_LABELS), if any."""
    marked = [step for step, label, _ in run.step_labels if label in PREFIX_ENDING_LABELS]
    return min(marked) if marked else None


def run_sft_row(run: SourceRun, spec: DatasetSpec) -> Row | None:
    record = run.record
    decisions = decision_points(record)
    if not decisions:
        return None
    found = [step for step in (first_harmful_step(record), labelled_harmful_step(run)) if step is not None]
    harmful = min(found) if found else None
    cutoff = _harmful_decision(decisions, harmful)
    entries = chat.conversation(record, decisions)
    messages = weighted_messages(entries, cutoff, spec.sft_mode)
    messages = chat.truncate(messages, spec.context_budget_tokens, instruction=record.instruction).messages
    trained = sum(1 for message in messages if message.get("weight") == 1)
    if trained == 0:
        return None
    group, split = split_for_task(run.task_key, spec)
    return {
        "kind": "sft",
        "trajectory_id": run.trajectory_id,
        "task_key": run.task_key,
        "task_set": record.task_set,
        "group_key": group,
        "split": split,
        "messages": messages,
        "outcome": bool(run_success(record)),
        "reward": run_return(record),
        "mode": spec.sft_mode,
        "harmful_step": harmful,
        "harmful_decision": cutoff,
        "step_count": len(decisions),
        "trained_turns": trained,
        "step_labels": step_label_values(run),
    }


def _harmful_decision(decisions: list[Decision], harmful: int | None) -> int | None:
    """The decision t holding the harmful step (a step between decisions belongs to the next one)."""
    if harmful is None:
        return None
    holder = decision_at(decisions, harmful)
    if holder is not None:
        return holder.t
    later = [decision.t for decision in decisions if decision.first_step > harmful]
    return later[0] if later else None


def weighted_messages(entries: list[chat.Entry], cutoff: int | None, mode: str) -> list[chat.Message]:
    """Messages with `weight` on assistant turns.

    A turn of decision t gets 1 when t is before `cutoff` (or there is no cutoff) and 0 otherwise; in
    truncate mode the conversation instead stops before the first turn of decision `cutoff`, and trailing
    non-assistant messages are dropped. Assistant messages no decision produced (few-shot examples in a
    recorded prompt) get 0: only the run's own decisions are trained.
    """
    messages: list[chat.Message] = []
    for entry in entries:
        harmful = cutoff is not None and entry.decision is not None and entry.decision >= cutoff
        is_assistant = entry.message.get("role") == "assistant"
        if harmful and is_assistant and mode == "truncate":
            break
        message = dict(entry.message)
        if is_assistant:
            message["weight"] = 1 if entry.decision is not None and not harmful else 0
        messages.append(message)
    if mode == "truncate":
        while messages and messages[-1].get("role") != "assistant":
            messages.pop()
    return messages
