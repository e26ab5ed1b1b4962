"""Value rows (one per decision point) and outcome rows (one per run).

Targets. A run with T decisions and return R (its reward, else 1 for success and 0 for failure) gives
decision t (numbered 1..T in run order) the target

    target_value = gamma ** (T - t) * R

so the last action gets gamma**0 * R = R and each earlier action is discounted once more per remaining
decision: the value of the state-action pair under the policy that produced the run.

Context. Decision t's context is what the model saw when it chose: its model call's request messages if
recorded, else the conversation rebuilt from the steps before it (see `chat`). It is cut to the spec's
token budget from the front, always keeping the system messages and the task. The action is the
assistant message the decision produced, kept whole and outside the budget.

Rubric labels and stats on a value row describe the state before the action (steps before the decision),
so nothing in a row's inputs depends on the action's own outcome.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from experience.distill import chat
from experience.distill.decisions import Decision, decision_points
from experience.distill.rubric import Rubric, RubricState, labels_of, rubric
from experience.distill.selection import selected_runs
from experience.distill.source import SourceRun, run_return, run_success
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.records import MessageRecord, TrajectoryRecord

Row = dict[str, Any]
STATS_KEYS = (
    "actions_before",
    "errors_before",
    "test_runs_before",
    "passed_test_runs_before",
    "source_edits_before",
    "context_tokens",
    "context_dropped",
)


def target_value(reward: float, t: int, step_count: int, gamma: float) -> float:
    """gamma ** (T - t) * R for decision t of T (1-based)."""
    if not 1 <= t <= step_count:
        raise ValueError(f"decision {t} is outside 1..{step_count}")
    return float(gamma ** (step_count - t) * reward)


def value_rows(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """One row per decision point of every selected run. Streams run by run (task by task when the spec
    balances negatives, which needs input ordered by task key)."""
    for run in selected_runs(runs, spec):
        yield from run_value_rows(run, spec)


def outcome_rows(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """One row per selected run: the whole conversation (cut to the budget) and whether it succeeded."""
    for run in selected_runs(runs, spec):
        row = run_outcome_row(run, spec)
        if row is not None:
            yield row


def run_value_rows(run: SourceRun, spec: DatasetSpec) -> Iterator[Row]:
    """The value rows of one run (none when it has no decisions or no outcome): those it carries when
    they were made ahead for this spec (`SourceRun.value_rows`), else made here."""
    if run.value_rows is not None:
        yield from run.value_rows
        return
    record = run.record
    reward = run_return(record)
    if reward is None:
        return
    base = _base_fields(run, spec, "value")
    outcome = bool(run_success(record))
    for inputs in decision_inputs(record, spec, run.scored):
        target = target_value(reward, inputs["step_index"], inputs["step_count"], spec.gamma)
        inputs.update(target_value=target, outcome=outcome, reward=reward)
        yield base | inputs


def decision_inputs(
    record: TrajectoryRecord, spec: DatasetSpec, scored: Rubric | None = None
) -> Iterator[Row]:
    """What a value model sees at each decision (no targets): context, action, rubric labels and
    stats before the action. Works on runs with no outcome yet, for scoring. `scored`: the run's rubric,
    when the caller has it already.

    The rows of a run share their context messages (the same dict objects), so writers can encode each
    distinct message once (`writers.RowEncoder`); they must not be changed. A context that extends the
    previous decision's costs only its added messages (`_Contexts`, `chat.MessageFacts`)."""
    decisions = decision_points(record)
    if not decisions:
        return
    scored = scored or rubric(record)
    contexts = _Contexts(record, decisions)
    facts = chat.MessageFacts()
    for decision in decisions:
        context, known_total = contexts.before(decision)
        cut = chat.truncate(
            context,
            spec.context_budget_tokens,
            instruction=record.instruction,
            known_total=known_total,
            facts=facts,
        )
        state = scored.state_before(decision.first_step)
        yield {
            "step_index": decision.t,
            "step_count": len(decisions),
            "record_step": decision.first_step,
            "messages": cut.messages,
            "action": chat.decision_message(record, decision),
            "rubric": dict(_labels(state)),
            "stats": _stats(state, cut, actions_before=decision.t - 1),
        }


def run_outcome_row(run: SourceRun, spec: DatasetSpec) -> Row | None:
    record = run.record
    decisions = decision_points(record)
    if not decisions:
        return None
    scored = run.scored
    messages = [entry.message for entry in chat.conversation(record, decisions)]
    cut = chat.truncate(messages, spec.context_budget_tokens, instruction=record.instruction)
    return _base_fields(run, spec, "outcome") | {
        "step_count": len(decisions),
        "messages": cut.messages,
        "outcome": bool(run_success(record)),
        "reward": run_return(record),
        "rubric": scored.run_labels,
        "stats": _stats(scored.final_state, cut, actions_before=len(decisions)),
    }


def _shared_messages(records: list[MessageRecord], shared: dict[int, chat.Message]) -> list[chat.Message]:
    messages = []
    for record in records:
        message = shared.get(id(record))
        if message is None:
            message = shared[id(record)] = record.as_openai()
        messages.append(message)
    return messages


class _Contexts:
    """What the model saw before each of a run's decisions, in order: (messages, the prompt token count if
    the call recorded it). A recorded request that starts with the
    previous one's message records (a harness growing its history) becomes the previous context plus
    the added messages; the conversation rebuilt from the steps is made only if a decision needs it."""

    def __init__(self, record: TrajectoryRecord, decisions: list[Decision]) -> None:
        self._record = record
        self._decisions = decisions
        self._shared: dict[int, chat.Message] = {}
        self._last: tuple[list[MessageRecord], list[chat.Message]] = ([], [])
        self._entries: tuple[list[chat.Entry], list[int]] | None = None

    def before(self, decision: Decision) -> tuple[list[chat.Message], int | None]:
        if decision.model_call is not None:
            call = self._record.steps[decision.model_call]
            if call.request_messages:
                return self._requested(call.request_messages), call.tokens_in
        # No recorded request: the conversation rebuilt from the steps, up to the decision's first step.
        entries, entry_steps = self._rebuilt()
        cut = bisect.bisect_left(entry_steps, decision.first_step)
        return [entry.message for entry in entries[:cut]], None

    def _requested(self, records: list[MessageRecord]) -> list[chat.Message]:
        previous, messages = self._last
        if chat.extends(records, previous):
            messages = messages + _shared_messages(records[len(previous) :], self._shared)
        else:
            messages = _shared_messages(records, self._shared)
        self._last = (records, messages)
        return messages

    def _rebuilt(self) -> tuple[list[chat.Entry], list[int]]:
        if self._entries is None:
            entries = chat.rebuild_conversation(self._record, self._decisions)
            self._entries = (entries, [entry.step_index for entry in entries])
        return self._entries


@functools.lru_cache(maxsize=4096)
def _labels(state: RubricState) -> dict[str, bool]:
    """`labels_of`, once per distinct state (states are few and repeat across rows and runs); callers
    copy the dict, so no row shares it."""
    return labels_of(state)


def _base_fields(run: SourceRun, spec: DatasetSpec, kind: str) -> Row:
    group, split = split_for_task(run.task_key, spec)
    return {
        "kind": kind,
        "trajectory_id": run.trajectory_id,
        "task_key": run.task_key,
        "task_set": run.record.task_set,
        "group_key": group,
        "split": split,
    }


def _stats(state: RubricState, cut: chat.Truncated, *, actions_before: int) -> dict[str, int]:
    """Counts a value model may use: the state before the action (at the end, for outcome rows)."""
    return {
        "actions_before": actions_before,
        "errors_before": state.errors,
        "test_runs_before": state.test_runs,
        "passed_test_runs_before": state.passed_test_runs,
        "source_edits_before": state.source_edits,
        "context_tokens": cut.tokens,
        "context_dropped": cut.dropped,
    }  # the keys of STATS_KEYS, in order
