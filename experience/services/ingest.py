"""Writing runs into the store: whole runs in bulk (imports, the API), and the live path (open a run, append
steps as they happen, finish it).

Bulk (`trajectories_ingest_many`, `trajectory_ingest`): every record is validated before anything is
written, and a batch is written in one transaction, so a malformed batch writes nothing. Idempotent on
(source, source_ref): a run already stored is skipped, so re-sending a batch or re-importing a file adds
nothing. On Postgres, blobs and steps go in with COPY; elsewhere (SQLite) with bulk_create.

Live (`trajectory_open`, `steps_append`, `trajectory_finish`): the built-in harness (command steps) and the
recording proxy (model calls) append to the same trajectory from different threads or processes. Step
numbers are handed out under a row lock on the trajectory, and if a step arrives late (its start time is
earlier than steps already stored) the trajectory's steps are renumbered so `seq` always follows time.
`steps_append` is idempotent on call ids, and on (trajectory, seq) when the caller numbers its steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from experience.dedup.signature import ACTION_KINDS, exact_hash
from experience.errors import LimitExceeded, NotFound, ValidationError
from experience.models import Step, Trajectory
from experience.records import TRAJECTORY_STATUSES, StepRecord, TrajectoryRecord
from experience.services.blobs import blob_put_many, blobs_store, sha256_hex
from experience.services.bulk import copy_new_objects, copy_rows, is_postgres, next_ids
from experience.services.provenance import check_source
from experience.services.stored import record_of, stored_step_records
from experience.services.validation import validate_step, validate_trajectory
from experience.steps import CONTEXT, BlobSink, PreparedStep, context_delta, prepare_step, refs_json

# Steps are renumbered by first moving them out of the way; numbers never reach this in one trajectory.
_RENUMBER_OFFSET = 1_000_000_000
# A batch that loses a race (a concurrent writer stored the same run, or a deadlock on a shared blob) is
# retried: the second pass sees the other writer's rows and skips them.
_ATTEMPTS = 3
_STEP_COLUMNS = (
    "id", "trajectory_id", "seq", "kind", "started_at", "ended_at", "duration_ms", "tokens_in", "tokens_out",
    "exit_code", "is_error", "call_id", "preview", "payload", "blob_refs",
)
# Steps go in COPY's binary format (nothing to escape; Postgres parses no text for numbers and times). A jsonb
# field in binary is a version byte then the JSON text (`_jsonb`); COPY sends no types, so it is declared
# bytea here only to have psycopg send those bytes as they are.
_STEP_TYPES = (
    "int8", "int8", "int4", "varchar", "timestamptz", "timestamptz", "float8", "int4", "int4",
    "int4", "bool", "varchar", "text", "bytea", "bytea",
)


@dataclass(frozen=True)
class IngestOutcome:
    """What happened to one record of a batch: stored now (`created`), or already there."""

    trajectory_id: int
    created: bool
    source: str
    source_ref: str


def _is_race(error: Exception) -> bool:
    """A unique key taken by a concurrent writer, or a deadlock / serialization failure between two."""
    if isinstance(error, IntegrityError):
        return True
    return getattr(error.__cause__, "sqlstate", None) in ("40P01", "40001")


# ---------------------------------------------------------------- bulk ingest


def trajectory_ingest(
    *, record: TrajectoryRecord, original: bytes | None = None, rollout_runner: bool = False
) -> tuple[Trajectory, bool]:
    """Store a whole finished run (import or API). All or nothing; a run already stored is left as is.

    `original` is the file the run was read from, kept as a blob. Returns (trajectory, created).
    `rollout_runner`: see trajectories_ingest_many.
    """
    original_blob = blob_put_many([original])[0] if original is not None else ""
    outcome = trajectories_ingest_many(records=[record], original_blob=original_blob, field_prefix="",
                                       rollout_runner=rollout_runner)[0]
    return Trajectory.objects.get(pk=outcome.trajectory_id), outcome.created


def trajectories_ingest_many(
    *,
    records: Sequence[TrajectoryRecord],
    original_blob: str = "",
    field_prefix: str = "trajectories[{index}].",
    index_offset: int = 0,
    rollout_runner: bool = False,
    original_blobs: Sequence[str] | None = None,
) -> list[IngestOutcome]:
    """Store many whole runs at once; one outcome per record, in order.

    Validates every record first, then writes in one transaction: all of the batch or none of it.
    Errors name the field, e.g. "trajectories[3].steps[7].kind" (`field_prefix` formatted with the record's
    index plus `index_offset`, for a caller feeding a longer stream in batches). Idempotent on
    (source, source_ref): a run already stored, or repeated within the batch, is not written again.
    `original_blob` (the sha256 of an already stored file) is recorded on every run created; `original_blobs`,
    one per record, instead, for a batch read from several files (experience.services.importing).
    A run whose source is `rollout` (in any spelling) is refused unless `rollout_runner` is true: only
    Trove's own runner passes it, never a view or an importer (experience.services.provenance).
    """
    for index, record in enumerate(records):
        where = field_prefix.format(index=index + index_offset)
        validate_trajectory(record, where=where)
        check_source(record.source, field=f"{where}source", rollout_runner=rollout_runner)
    if original_blobs is not None and len(original_blobs) != len(records):
        raise ValueError("original_blobs: one per record")
    originals = list(original_blobs) if original_blobs is not None else [original_blob] * len(records)
    for attempt in range(_ATTEMPTS):
        try:
            with transaction.atomic():
                return _write_batch(records, originals)
        except (IntegrityError, OperationalError) as error:
            if attempt == _ATTEMPTS - 1 or not _is_race(error):
                raise
    raise AssertionError("unreachable")


def _write_batch(records: Sequence[TrajectoryRecord], originals: Sequence[str]) -> list[IngestOutcome]:
    known = _existing_ids(records)
    fresh: dict[tuple[str, str], tuple[TrajectoryRecord, str]] = {}
    for record, original in zip(records, originals, strict=True):
        key = (record.source, record.source_ref)
        if key not in known:
            fresh.setdefault(key, (record, original))
    if fresh:
        known.update(_insert_runs(list(fresh.values())))
    created_keys = set(fresh)
    outcomes = []
    for record in records:
        key = (record.source, record.source_ref)
        outcomes.append(IngestOutcome(known[key], key in created_keys, *key))
        created_keys.discard(key)  # a run repeated within the batch is created once
    return outcomes


def _existing_ids(records: Sequence[TrajectoryRecord]) -> dict[tuple[str, str], int]:
    """Ids of the runs already stored, by (source, source_ref): lookups on the unique index, per source."""
    by_source: dict[str, set[str]] = {}
    for record in records:
        by_source.setdefault(record.source, set()).add(record.source_ref)
    found: dict[tuple[str, str], int] = {}
    for source, refs in by_source.items():
        ordered = sorted(refs)
        for start in range(0, len(ordered), 1000):
            rows = Trajectory.objects.filter(source=source, source_ref__in=ordered[start : start + 1000])
            found.update(((source, ref), pk) for pk, ref in rows.values_list("pk", "source_ref"))
    return found


def _insert_runs(runs: list[tuple[TrajectoryRecord, str]]) -> dict[tuple[str, str], int]:
    """Write the runs, each (record, sha256 of the file it was read from or "")."""
    rows = [_trajectory_row(record, original_blob) for record, original_blob in runs]
    records = [record for record, _ in runs]
    if is_postgres():
        copy_new_objects(rows)
    else:
        Trajectory.objects.bulk_create(rows, batch_size=500)
    # Steps before blobs (no constraint ties them; the transaction makes them visible together), so each
    # step is prepared while it streams into COPY: Python's work overlaps Postgres' instead of adding to it.
    sink = BlobSink()
    _insert_steps([(row.pk, record.steps) for row, record in zip(rows, records, strict=True)], sink)
    blobs_store(sink.contents)
    return {(row.source, row.source_ref): row.pk for row in rows}


def _trajectory_row(record: TrajectoryRecord, original_blob: str) -> Trajectory:
    return Trajectory(
        source=record.source,
        source_ref=record.source_ref,
        original_blob=original_blob,
        next_seq=len(record.steps),
        content_hash=exact_hash(record),
        **_trajectory_fields(record),
        **_totals(record.steps, record.metadata),
        duration_s=_duration(record.started_at, record.finished_at),
    )


def _insert_steps(runs: list[tuple[int, list[StepRecord]]], sink: BlobSink) -> None:
    if is_postgres():
        ids = next_ids(Step._meta.db_table, "id", sum(len(steps) for _, steps in runs))
        copy_rows(Step._meta.db_table, _STEP_COLUMNS, _step_copy_rows(runs, sink, iter(ids)), types=_STEP_TYPES)
    else:  # contexts as full lists: a delta names its base's id, which bulk_create does not give beforehand
        prepared = (
            (trajectory_id, seq, prepare_step(step, sink))
            for trajectory_id, steps in runs for seq, step in enumerate(steps)
        )
        Step.objects.bulk_create([_step_row(*item) for item in prepared])


def _step_copy_rows(runs: list[tuple[int, list[StepRecord]]], sink: BlobSink, ids: Iterator[int]) -> Iterator[tuple]:
    """The COPY rows of the runs' steps, ids taken from `ids`; each model call's context that shares a
    prefix with the run's previous one is stored as a delta on it (experience.steps.context_delta)."""
    for trajectory_id, steps in runs:
        previous: tuple[int, list[str]] | None = None  # the run's last model call so far: (id, full context)
        for seq, step in enumerate(steps):
            step_id, item = next(ids), prepare_step(step, sink)
            refs = item.blob_refs
            context = refs.get(CONTEXT)
            if context is not None:
                if previous is not None:
                    refs = {**refs, CONTEXT: context_delta(*previous, context)}
                previous = (step_id, context)
            yield _copy_row(step_id, trajectory_id, seq, item, refs)


def _copy_row(step_id: int, trajectory_id: int, seq: int, item: PreparedStep, refs: dict[str, Any]) -> tuple:
    r = item.record
    return (
        step_id, trajectory_id, seq, r.kind, r.started_at, r.ended_at, r.duration_ms, r.tokens_in, r.tokens_out,
        r.exit_code, r.is_error, r.call_id, item.preview, _jsonb(item.payload_json), _jsonb(refs_json(refs)),
    )


def _jsonb(text: str) -> bytes:
    """A jsonb value in COPY's binary format: version 1, then the JSON text."""
    return b"\x01" + text.encode()


def _step_row(trajectory_id: int, seq: int, item: PreparedStep, *, derive_duration: bool = False) -> Step:
    record = item.record
    duration = record.duration_ms
    if derive_duration and duration is None and record.started_at and record.ended_at:
        duration = (record.ended_at - record.started_at).total_seconds() * 1000
    return Step(
        trajectory_id=trajectory_id,
        seq=seq,
        kind=record.kind,
        started_at=record.started_at,
        ended_at=record.ended_at,
        duration_ms=duration,
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        exit_code=record.exit_code,
        is_error=record.is_error,
        call_id=record.call_id,
        preview=item.preview,
        payload=item.payload,
        blob_refs=item.blob_refs,
    )


def _trajectory_fields(record: TrajectoryRecord) -> dict:
    return {
        "source_format": record.source_format,
        "source_version": record.source_version,
        "task_set": record.task_set,
        "task_key": record.task_key,
        "instruction": record.instruction,
        "harness": record.harness,
        "model": record.model,
        "status": record.status,
        "reward": record.reward,
        "success": record.success,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "cost": record.cost,
        "final_diff": record.final_diff,
        "metadata": record.metadata,
    }


def _totals(steps: Sequence[StepRecord], metadata: dict[str, Any]) -> dict[str, int]:
    """Step and token counts. Sources that report tokens only per run (SWE-agent) put them in
    metadata["usage"]; those totals are used when no step carries a count of its own."""
    tokens_in = [s.tokens_in for s in steps if s.tokens_in is not None]
    tokens_out = [s.tokens_out for s in steps if s.tokens_out is not None]
    usage = metadata.get("usage") if isinstance(metadata, dict) else None
    return {
        "n_steps": len(steps),
        "n_model_calls": sum(1 for s in steps if s.kind == "model_call"),
        "tokens_in": sum(tokens_in) if tokens_in else _usage_count(usage, "tokens_in"),
        "tokens_out": sum(tokens_out) if tokens_out else _usage_count(usage, "tokens_out"),
    }


def _usage_count(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _duration(started: datetime | None, finished: datetime | None) -> float | None:
    return (finished - started).total_seconds() if started and finished else None


# ---------------------------------------------------------------- the live path


def trajectory_open(*, record: TrajectoryRecord, exclusive: bool = False, rollout_runner: bool = False) -> Trajectory:
    """Create the trajectory row for a run that is starting (steps come later). Idempotent on source_ref.

    Inside a caller's transaction this is a savepoint and one INSERT: the run is almost always new, so the
    lookup is made only when the insert finds it taken. `exclusive`: a run already there raises
    IntegrityError instead (failing the caller's transaction), for a caller to whom it means the work is
    someone else's (a rollout attempt's claim); then it is the INSERT alone. `rollout_runner`: the caller
    is Trove's rollout runner, the only one that may open a run whose source is `rollout`."""
    validate_trajectory(record)
    check_source(record.source, field="source", rollout_runner=rollout_runner)

    def insert() -> Trajectory:
        return Trajectory.objects.create(source=record.source, source_ref=record.source_ref,
                                         **_trajectory_fields(record))

    if exclusive:
        return insert()
    try:
        with transaction.atomic():
            return insert()
    except IntegrityError:
        return Trajectory.objects.get(source=record.source, source_ref=record.source_ref)


def steps_append(*, trajectory_id: int, steps: Sequence[StepRecord], first_seq: int | None = None) -> list[Step]:
    """Append steps in the given order. Idempotent on `call_id`: a call already stored is skipped.

    With `first_seq`, the steps are numbered first_seq, first_seq + 1, ... and those numbers already
    stored are skipped, so a client that retries a chunk of numbered steps adds each once; a chunk that
    would leave a gap is refused. Validates every step before writing any; writes blobs, then steps, in
    one transaction.
    """
    for index, step in enumerate(steps):
        validate_step(step, index=index)
    if first_seq is not None and first_seq < 0:
        raise ValidationError("first_seq: must be 0 or more", field="first_seq")
    sink = BlobSink()
    prepared = [prepare_step(step, sink) for step in steps]
    # Unnumbered steps without call ids cannot collide with anything stored (and are all added): inside a
    # caller's transaction they need no savepoint of their own, two round trips fewer (the runner's batches).
    savepoint = first_seq is not None or not prepared or any(p.record.call_id for p in prepared)
    for attempt in range(2):
        try:
            with transaction.atomic(savepoint=savepoint):
                blobs_store(sink.contents)
                return _append(trajectory_id, prepared, first_seq)
        except IntegrityError:
            # A concurrent writer stored one of our call ids between our check and insert: retry once,
            # the duplicate is now visible and gets skipped.
            if attempt:
                raise
    raise AssertionError("unreachable")


def _append(trajectory_id: int, prepared: list[PreparedStep], first_seq: int | None) -> list[Step]:
    # Three statements when the steps come in time order (the usual case): reserve their numbers under the
    # row lock (counting them into the run's totals), look for call ids already stored and anything stored
    # later than them, insert.
    given = prepared
    start = _locked(trajectory_id, reserve=len(given), counts=_live_counts(given))
    if first_seq is not None:
        if first_seq > start:
            raise ValidationError(
                f"first_seq: {first_seq} would leave a gap; the trajectory's next step is {start}", field="first_seq"
            )
        prepared = prepared[start - first_seq :]
    earliest_new = min((p.record.started_at for p in prepared if p.record.started_at), default=None)
    fresh, out_of_order = _not_yet_stored(trajectory_id, prepared, earliest_new)
    if not fresh:
        transaction.set_rollback(True)  # nothing to add: undo the reservation (and the reindex flag)
        return []
    if start + len(fresh) > settings.TROVE_MAX_STEPS_PER_TRAJECTORY:
        raise LimitExceeded(
            f"trajectory {trajectory_id} would exceed {settings.TROVE_MAX_STEPS_PER_TRAJECTORY} steps", field="steps"
        )
    if len(fresh) != len(given):  # some were stored already: give back the numbers and counts they reserved
        reserved, kept = _live_counts(given), _live_counts(fresh)
        Trajectory.objects.filter(pk=trajectory_id).update(
            next_seq=start + len(fresh), **{name: F(name) - (n - kept[name]) for name, n in reserved.items()})
    rows = [_step_row(trajectory_id, start + i, item, derive_duration=True) for i, item in enumerate(fresh)]
    created = Step.objects.bulk_create(rows)
    if out_of_order:
        _renumber_by_time(trajectory_id)
    return created


def _not_yet_stored(
    trajectory_id: int, prepared: list[PreparedStep], earliest_new: datetime | None
) -> tuple[list[PreparedStep], bool]:
    """The steps whose call id is not stored yet (nor repeated earlier in `prepared`), and whether a step
    already stored started later than the earliest of `prepared` (then seq must be renumbered by time).
    One query, none when there is neither a call id nor a start time to check."""
    call_ids = [p.record.call_id for p in prepared if p.record.call_id]
    seen: set[str] = set()
    out_of_order = False
    if call_ids or earliest_new:
        later = Q(started_at__gt=earliest_new) if earliest_new else Q(pk__in=[])
        rows = Step.objects.filter(Q(call_id__in=call_ids) | later, trajectory_id=trajectory_id)
        for call_id, started_at in rows.values_list("call_id", "started_at"):
            if call_id in call_ids:
                seen.add(call_id)
            if earliest_new and started_at and started_at > earliest_new:
                out_of_order = True
    fresh = []
    for item in prepared:
        if item.record.call_id and item.record.call_id in seen:
            continue
        if item.record.call_id:
            seen.add(item.record.call_id)
        fresh.append(item)
    return fresh, out_of_order


def _live_counts(items: Sequence[PreparedStep]) -> dict[str, int]:
    """What `items` add to a run's counts, so a running run's totals follow its steps (trajectory_finish
    recounts them from the stored steps at the end)."""
    records = [item.record for item in items]
    return {
        "n_steps": len(records),
        "n_model_calls": sum(1 for r in records if r.kind == "model_call"),
        "tokens_in": sum(r.tokens_in or 0 for r in records),
        "tokens_out": sum(r.tokens_out or 0 for r in records),
    }


def _locked(trajectory_id: int, *, reserve: int, counts: dict[str, int]) -> int:
    """Lock the trajectory's row, reserve `reserve` step numbers and add `counts` to its totals; returns the
    first number. One statement (an UPDATE takes the row lock itself); it also puts the run back into the
    search indexer's queue, as the new steps have no search document yet. The caller's transaction undoes
    it all if it adds nothing."""
    totals = ", ".join(f"{name} = {name} + %s" for name in counts)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Trajectory._meta.db_table} SET next_seq = next_seq + %s, {totals}, search_indexed = %s "
            "WHERE id = %s RETURNING next_seq",
            [reserve, *counts.values(), False, trajectory_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"trajectory {trajectory_id} does not exist")
    return row[0] - reserve


def _renumber_by_time(trajectory_id: int) -> None:
    """Make seq follow started_at (steps without a time go last, in their order). Caller holds the lock.

    Done in the database, touching only the steps whose number changes: they are first moved out of the
    way (past _RENUMBER_OFFSET) so no intermediate state violates the (trajectory, seq) unique key."""
    table = Step._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET seq = %s + ordered.new_seq FROM ("
            f"  SELECT id, seq, ROW_NUMBER() OVER (ORDER BY started_at IS NULL, started_at, seq) - 1 AS new_seq"
            f"  FROM {table} WHERE trajectory_id = %s"
            f") AS ordered WHERE {table}.id = ordered.id AND ordered.seq <> ordered.new_seq",
            [_RENUMBER_OFFSET, trajectory_id],
        )
        if cursor.rowcount:
            cursor.execute(f"UPDATE {table} SET seq = seq - %s WHERE trajectory_id = %s AND seq >= %s",
                           [_RENUMBER_OFFSET, trajectory_id, _RENUMBER_OFFSET])


@dataclass(frozen=True)
class Tally:
    """A run's counts and action hash as stored when its first `next_seq` steps were all there (see
    trajectory_tally): what trajectory_finish would compute, worked out ahead of it."""

    next_seq: int
    started_at: datetime | None
    n_steps: int
    n_model_calls: int
    tokens_in: int
    tokens_out: int
    content_hash: str

    def with_steps(self, steps: Sequence[StepRecord]) -> Tally | None:
        """This tally once `steps` are appended, or None when they change the hash or the token counts (an
        action, or a step with tokens): then only a recount will do."""
        if any(s.kind in ACTION_KINDS or s.tokens_in is not None or s.tokens_out is not None for s in steps):
            return None
        return replace(self, next_seq=self.next_seq + len(steps), n_steps=self.n_steps + len(steps))


def trajectory_tally(*, trajectory_id: int) -> Tally | None:
    """Counts and the action hash of the run as stored now, so a caller can compute them off its critical
    path (a rollout, while its evaluation runs) and hand them to trajectory_finish. None when an append
    landed between the two reads (nothing is locked: the tally is checked against the run when used)."""
    trajectory = Trajectory.objects.get(pk=trajectory_id)
    steps = list(Step.objects.filter(trajectory_id=trajectory_id).order_by("seq"))
    if len(steps) != trajectory.next_seq:
        return None
    totals = _totals_of(trajectory, steps)
    return Tally(next_seq=trajectory.next_seq, started_at=trajectory.started_at, **totals)


def trajectory_finish(
    *,
    trajectory_id: int,
    status: str,
    reward: float | None = None,
    success: bool | None = None,
    final_diff: str | None = None,
    finished_at: datetime | None = None,
    tally: Tally | None = None,
) -> Trajectory | None:
    """Set the outcome and recompute counts and the content hash. Safe to call again (recomputes).

    With `tally` (trajectory_tally, plus what the caller appended since: Tally.with_steps) the outcome is one
    UPDATE, conditional on the run still having exactly the steps the tally covers; otherwise, or if steps
    came meanwhile, everything is recounted. Returns the trajectory, or None when the tally was used (the
    row is not read back)."""
    if status not in TRAJECTORY_STATUSES:
        raise ValidationError(f"status: {status!r} is not a trajectory status", field="status")
    finished_at = finished_at or timezone.now()
    outcome = {"status": status, "reward": reward, "success": success, "finished_at": finished_at}
    if final_diff is not None:
        outcome["final_diff"] = final_diff
    # No savepoint of its own inside a caller's transaction: nothing here is retried, a failure fails it all.
    with transaction.atomic(savepoint=False):
        if tally is not None and _finish_with_tally(trajectory_id, tally, outcome):
            return None
        trajectory = Trajectory.objects.select_for_update().get(pk=trajectory_id)
        for name, value in outcome.items():
            setattr(trajectory, name, value)
        _recount(trajectory)
        trajectory.save(update_fields=_FINISH_FIELDS)
    return trajectory


_FINISH_FIELDS = ("status", "reward", "success", "final_diff", "finished_at", "n_steps", "n_model_calls", "tokens_in",
                  "tokens_out", "duration_s", "content_hash", "updated_at")


def _finish_with_tally(trajectory_id: int, tally: Tally, outcome: dict[str, Any]) -> bool:
    totals = {name: getattr(tally, name) for name in ("n_steps", "n_model_calls", "tokens_in", "tokens_out",
                                                       "content_hash")}
    return bool(Trajectory.objects.filter(pk=trajectory_id, next_seq=tally.next_seq).update(
        **outcome, **totals, duration_s=_duration(tally.started_at, outcome["finished_at"]), updated_at=timezone.now()
    ))


def _recount(trajectory: Trajectory) -> None:
    """Counts and the action hash from one read of the run's steps (no aggregate query of its own)."""
    steps = list(Step.objects.filter(trajectory_id=trajectory.pk).order_by("seq"))
    for name, value in _totals_of(trajectory, steps).items():
        setattr(trajectory, name, value)
    trajectory.duration_s = _duration(trajectory.started_at, trajectory.finished_at)


def _totals_of(trajectory: Trajectory, steps: list[Step]) -> dict[str, Any]:
    tokens_in = [s.tokens_in for s in steps if s.tokens_in is not None]
    tokens_out = [s.tokens_out for s in steps if s.tokens_out is not None]
    usage = trajectory.metadata.get("usage") if isinstance(trajectory.metadata, dict) else None
    return {
        "n_steps": len(steps),
        "n_model_calls": sum(1 for s in steps if s.kind == "model_call"),
        "tokens_in": sum(tokens_in) if tokens_in else _usage_count(usage, "tokens_in"),
        "tokens_out": sum(tokens_out) if tokens_out else _usage_count(usage, "tokens_out"),
        "content_hash": _action_hash(trajectory, [s for s in steps if s.kind in ACTION_KINDS]),
    }


def _action_hash(trajectory: Trajectory, steps: list[Step]) -> str:
    """The exact-dedup hash (experience.dedup.signature.exact_hash) of the stored run's actions (`steps`:
    its command, tool_call and model_call rows, in seq order)."""
    return exact_hash(record_of(trajectory, stored_step_records(steps, context=False)))


__all__ = [
    "IngestOutcome",
    "sha256_hex",
    "steps_append",
    "trajectories_ingest_many",
    "trajectory_finish",
    "trajectory_ingest",
    "trajectory_open",
    "trajectory_tally",
    "validate_step",
    "validate_trajectory",
]
