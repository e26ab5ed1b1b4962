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

from collections.abc import Iterable, Iterator
from typing import Any

from experience.distill import chat
from experience.distill.decisions import decision_points
from experience.distill.digest import decision_stats, derive, rubric_counts
from experience.distill.rubric import Rubric
from experience.distill.selection import selected_runs
from experience.distill.source import SourceRun, run_return, run_success, step_label_values
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.records import TrajectoryRecord

Row = dict[str, Any]


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
    """The value rows of one run (none when it has no decisions or no outcome), made from its digest (the
    one it was read with, else derived from its steps)."""
    record = run.record
    reward = run_return(record)
    if reward is None:
        return
    digest = run.digest if run.digest is not None else derive(record, run.scored)
    base = _base_fields(run, spec, "value")
    outcome = bool(run_success(record))
    for inputs in digest.inputs(spec.context_budget_tokens, record.instruction):
        target = target_value(reward, inputs["step_index"], inputs["step_count"], spec.gamma)
        inputs.update(target_value=target, outcome=outcome, reward=reward)
        if run.rubric_overrides:
            inputs["rubric"] = {**inputs["rubric"], **dict(run.rubric_overrides)}
        yield base | inputs


def decision_inputs(
    record: TrajectoryRecord, spec: DatasetSpec, scored: Rubric | None = None
) -> Iterator[Row]:
    """What a value model sees at each decision (no targets): context, action, rubric labels and
    stats before the action (`digest.RunDigest.inputs`). Works on runs with no outcome yet, for scoring.
    `scored`: the run's rubric, when the caller has it already."""
    return derive(record, scored).inputs(spec.context_budget_tokens, record.instruction)


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
        "rubric": {**scored.run_labels, **dict(run.rubric_overrides)},
        "stats": decision_stats(rubric_counts(scored.final_state), cut, actions_before=len(decisions)),
    }


def _base_fields(run: SourceRun, spec: DatasetSpec, kind: str) -> Row:
    group, split = split_for_task(run.task_key, spec)
    return {
        "kind": kind,
        "trajectory_id": run.trajectory_id,
        "task_key": run.task_key,
        "task_set": run.record.task_set,
        "group_key": group,
        "split": split,
        "step_labels": step_label_values(run),
    }
