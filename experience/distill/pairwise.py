"""Pairwise rows: a run that solved a task (chosen) against one that failed it (rejected).

Pairs never cross tasks: both runs saw the same task, so the preference is about how they worked, not
about what they were asked. Each task gives at most `max_pairs_per_task` pairs, picked as the pairs with
the lowest hash(seed, chosen id, rejected id), so an easy task with many runs cannot dominate the set and
a rebuild picks the same pairs whatever order the runs arrived in.

Streaming: runs are taken one task at a time, so the caller must supply records ordered by task key (a
task seen again after another raises `UnorderedInputError`); memory holds one task's runs.

A row holds `prompt` (the kept system messages and the task) and `chosen` / `rejected` (the rest of each
conversation), each conversation cut to the budget from the front as for the other kinds;
`chosen_step_labels` / `rejected_step_labels` are each side's curator step labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from experience.distill import chat
from experience.distill.decisions import decision_points
from experience.distill.selection import eligible, grouped_by_task
from experience.distill.source import SourceRun, run_return, run_success, step_label_values
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task, unit_interval

Row = dict[str, Any]


def pairwise_rows(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """Chosen/rejected pairs of eligible runs, task by task (input ordered by task key)."""
    for task_key, task_runs in grouped_by_task(eligible(runs, spec)):
        yield from task_pairs(task_key, task_runs, spec)


def task_pairs(task_key: str, task_runs: list[SourceRun], spec: DatasetSpec) -> Iterator[Row]:
    """The capped pairs of one task, in a deterministic order."""
    usable = [run for run in task_runs if decision_points(run.record)]
    winners = [run for run in usable if run_success(run.record)]
    losers = [run for run in usable if not run_success(run.record)]
    candidates = [(chosen, rejected) for chosen in winners for rejected in losers]
    candidates.sort(
        key=lambda pair: unit_interval(spec.seed, "pair", pair[0].trajectory_id, pair[1].trajectory_id)
    )
    chosen_first = _preferred_pairs(usable, spec)
    taken = {(a.trajectory_id, b.trajectory_id) for a, b in chosen_first}
    candidates = chosen_first + [pair for pair in candidates
                                 if (pair[0].trajectory_id, pair[1].trajectory_id) not in taken
                                 and (pair[1].trajectory_id, pair[0].trajectory_id) not in taken]
    group, split = split_for_task(task_key, spec)
    for chosen, rejected in candidates[: spec.max_pairs_per_task]:
        prompt, chosen_turns = _prompt_and_turns(chosen, spec)
        _, rejected_turns = _prompt_and_turns(rejected, spec)
        yield {
            "kind": "pairwise",
            "task_key": task_key,
            "task_set": chosen.record.task_set,
            "group_key": group,
            "split": split,
            "prompt": prompt,
            "chosen": chosen_turns,
            "rejected": rejected_turns,
            "chosen_trajectory_id": chosen.trajectory_id,
            "rejected_trajectory_id": rejected.trajectory_id,
            "chosen_reward": run_return(chosen.record),
            "rejected_reward": run_return(rejected.record),
            "chosen_step_labels": step_label_values(chosen),
            "rejected_step_labels": step_label_values(rejected),
        }


def _preferred_pairs(usable: list[SourceRun], spec: DatasetSpec) -> list[tuple[SourceRun, SourceRun]]:
    """The task's pairs a curator chose (spec.preferences), in the order they were given, among its usable
    runs: whatever the runs' outcomes, a person's choice comes before success-against-failure."""
    by_id = {run.trajectory_id: run for run in usable}
    return [(by_id[chosen], by_id[rejected]) for chosen, rejected in spec.preferences
            if chosen in by_id and rejected in by_id and chosen != rejected]


def _prompt_and_turns(run: SourceRun, spec: DatasetSpec) -> tuple[list[chat.Message], list[chat.Message]]:
    record = run.record
    messages = [entry.message for entry in chat.conversation(record, decision_points(record))]
    kept = chat.truncate(messages, spec.context_budget_tokens, instruction=record.instruction).messages
    task = chat.task_index(kept, record.instruction)
    split_at = 0 if task is None else task + 1
    return kept[:split_at], kept[split_at:]
