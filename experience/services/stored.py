"""Reading stored runs back as the records they were ingested from (the inverse of ingest).

`stored_records` walks any queryset of trajectories in chunks: a fixed number of queries per chunk (the
trajectories, their steps, the blobs those steps refer to), memory bounded by one chunk, so an export of a
million runs streams.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from django.db.models import QuerySet

from experience.models import Step, Trajectory
from experience.records import StepRecord, TrajectoryRecord
from experience.services.blobs import blob_get_many
from experience.steps import CONTEXT, context_bases, full_contexts, referenced_hashes, step_record_from_parts

CHUNK = 50  # trajectories per round of queries when streaming: bounds memory by a chunk's steps and blobs


def stored_step_records(steps: Sequence[Step], *, context: bool = True) -> list[StepRecord]:
    """Full StepRecords for step rows (any of them: a page of a run will do), fetching the blobs they refer
    to in one query, and with contexts, the rows their contexts extend in one more when not among `steps`.

    With `context=False` a model call's request messages are not fetched (request_messages is None):
    the cheap form for lists and for code that reads actions only.
    """
    contexts = step_contexts(steps) if context else {}
    hashes = [h for step in steps for h in referenced_hashes(step.blob_refs, context=False)]
    hashes += [h for digests in contexts.values() for h in digests]
    blobs = blob_get_many(hashes) if hashes else {}
    return [_step_record(step, blobs, contexts) for step in steps]  # contexts empty: none read


def step_contexts(steps: Sequence[Step]) -> dict[int, list[str]]:
    """The full context (message digests) of each of `steps` that has one, by step id. Contexts stored as
    deltas on steps not among `steps` (an earlier page of the run) are completed with one query for
    the run's earlier contexts."""
    refs_by_step = {step.pk: step.blob_refs for step in steps if CONTEXT in step.blob_refs}
    missing = context_bases(refs_by_step)
    if missing:
        refs_by_step.update(_earlier_contexts({step.trajectory_id for step in steps}, max(missing)))
    return full_contexts(refs_by_step, [step.pk for step in steps if CONTEXT in step.blob_refs])


def _earlier_contexts(trajectory_ids: set[int], up_to_id: int) -> dict[int, dict]:
    """The blob_refs of every step with a context in these runs up to step id `up_to_id`: a chain of
    deltas runs through a run's earlier model calls, and only those, since a base has a smaller id."""
    rows = Step.objects.filter(trajectory_id__in=trajectory_ids, id__lte=up_to_id, blob_refs__has_key=CONTEXT)
    return dict(rows.values_list("id", "blob_refs"))


def _step_record(step: Step, blobs: dict[str, bytes], contexts: dict[int, list[str]]) -> StepRecord:
    """`contexts`: the step's full context by step id, or nothing for a record without request messages."""
    refs = step.blob_refs
    if CONTEXT in refs:
        refs = {k: v for k, v in refs.items() if k != CONTEXT}
        if step.pk in contexts:
            refs[CONTEXT] = contexts[step.pk]
    return step_record_from_parts(
        kind=step.kind, payload=step.payload, blob_refs=refs, blobs=blobs,
        started_at=step.started_at, ended_at=step.ended_at, duration_ms=step.duration_ms,
        exit_code=step.exit_code, tokens_in=step.tokens_in, tokens_out=step.tokens_out,
        call_id=step.call_id, is_error=step.is_error,
    )


def record_of(trajectory: Trajectory, steps: list[StepRecord]) -> TrajectoryRecord:
    return TrajectoryRecord(
        source=trajectory.source,
        source_format=trajectory.source_format,
        source_ref=trajectory.source_ref,
        task_key=trajectory.task_key,
        instruction=trajectory.instruction,
        source_version=trajectory.source_version,
        task_set=trajectory.task_set,
        harness=trajectory.harness,
        model=trajectory.model,
        status=trajectory.status,
        reward=trajectory.reward,
        success=trajectory.success,
        started_at=trajectory.started_at,
        finished_at=trajectory.finished_at,
        cost=trajectory.cost,
        final_diff=trajectory.final_diff,
        metadata=trajectory.metadata,
        steps=steps,
    )


def stored_records(
    trajectories: QuerySet[Trajectory], *, chunk: int = CHUNK
) -> Iterator[tuple[Trajectory, TrajectoryRecord]]:
    """Each trajectory of the queryset (in id order) with its whole record, one chunk at a time.

    Keyset-paged on id, so rows added while it runs do not shift pages; a run deleted mid-way is skipped.
    """
    ordered = trajectories.defer(None).order_by("id")  # a record needs every column a list defers
    after = 0
    while True:
        batch = list(ordered.filter(id__gt=after)[:chunk])
        if not batch:
            return
        yield from _with_steps(batch)
        after = batch[-1].pk


def _with_steps(batch: list[Trajectory]) -> Iterable[tuple[Trajectory, TrajectoryRecord]]:
    by_trajectory: dict[int, list[Step]] = defaultdict(list)
    for step in Step.objects.filter(trajectory_id__in=[t.pk for t in batch]).order_by("trajectory_id", "seq"):
        by_trajectory[step.trajectory_id].append(step)
    all_steps = [s for t in batch for s in by_trajectory[t.pk]]
    records = iter(stored_step_records(all_steps))
    for trajectory in batch:
        steps = [next(records) for _ in by_trajectory[trajectory.pk]]
        yield trajectory, record_of(trajectory, steps)
