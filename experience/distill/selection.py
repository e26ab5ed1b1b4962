"""Which runs a spec uses, and per-task grouping for the kinds that need a whole task at once."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from experience.distill.errors import UnorderedInputError
from experience.distill.source import CURATION_REJECTED, UNUSABLE_STATUSES, SourceRun, run_success
from experience.distill.spec import DatasetSpec
from experience.distill.splits import unit_interval


def exclusion_reason(run: SourceRun, spec: DatasetSpec) -> str | None:
    """Why the spec leaves this run out, or None when it is used.

    Reasons: `duplicate` (a duplicate of a run with the same outcome: a duplicate whose outcome differs
    from the run it was marked against is kept, so a success is never left out behind a failure) and
    `rejected` (unless the spec includes them), `unusable_status` (the run was still running, cancelled or
    broke on infrastructure: it says nothing about the agent), `no_outcome` (no success flag and no
    reward: there is nothing to learn a value from).
    """
    if is_same_outcome_duplicate(run) and not spec.include_duplicates:
        return "duplicate"
    if run.curation == CURATION_REJECTED and not spec.include_rejected:
        return "rejected"
    if run.record.status in UNUSABLE_STATUSES:
        return "unusable_status"
    if run_success(run.record) is None:
        return "no_outcome"
    return None


def is_same_outcome_duplicate(run: SourceRun) -> bool:
    """Marked a duplicate of a run with the same outcome: the only duplicates a build may leave out."""
    return run.is_duplicate and not run.duplicate_outcome_differs


def kept_despite_duplicate_mark(run: SourceRun, spec: DatasetSpec) -> bool:
    """Marked a duplicate, but of a run whose outcome differs: the build keeps it (and counts it)."""
    return run.is_duplicate and run.duplicate_outcome_differs and not spec.include_duplicates


def eligible(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[SourceRun]:
    """The runs the spec uses, in input order (streaming)."""
    return (run for run in runs if exclusion_reason(run, spec) is None)


def grouped_by_task(runs: Iterable[SourceRun]) -> Iterator[tuple[str, list[SourceRun]]]:
    """Consecutive runs of one task, as (task key, runs); holds one task in memory at a time.

    The caller must order records by task key. A task that shows up again after another task raises
    `UnorderedInputError` rather than silently splitting one task into two groups.
    """
    finished: set[str] = set()
    current_key: str | None = None
    current: list[SourceRun] = []
    for run in runs:
        if run.task_key != current_key:
            if current_key is not None:
                finished.add(current_key)
                yield current_key, current
            if run.task_key in finished:
                raise UnorderedInputError(run.task_key)
            current_key, current = run.task_key, []
        current.append(run)
    if current_key is not None:
        yield current_key, current


def balance_negatives(task_runs: list[SourceRun], spec: DatasetSpec) -> list[SourceRun]:
    """One task's runs with failed runs capped at `neg_pos_ratio` per successful run.

    Keeps every success and the ceil(ratio * max(successes, 1)) failures with the lowest
    hash(seed, trajectory id), in input order. A task nobody solved still keeps ceil(ratio) failures, so
    hard tasks stay represented without dominating. With no ratio every run is kept.
    """
    if spec.neg_pos_ratio is None:
        return task_runs
    positives = sum(1 for run in task_runs if run_success(run.record))
    failures = [run for run in task_runs if not run_success(run.record)]
    keep = math.ceil(spec.neg_pos_ratio * max(positives, 1))
    ranked = sorted(failures, key=lambda run: unit_interval(spec.seed, "neg", run.trajectory_id))
    kept_ids = {run.trajectory_id for run in ranked[:keep]}
    return [run for run in task_runs if run_success(run.record) or run.trajectory_id in kept_ids]


def selected_runs(runs: Iterable[SourceRun], spec: DatasetSpec) -> Iterator[SourceRun]:
    """Eligible runs after negative balancing. Streams run by run when no ratio is set; with a ratio,
    task by task (input ordered by task key)."""
    usable = eligible(runs, spec)
    if spec.neg_pos_ratio is None:
        yield from usable
        return
    for _task, task_runs in grouped_by_task(usable):
        yield from balance_negatives(task_runs, spec)
