"""Writing runs into the store: create a trajectory, append steps (idempotent), finish it, import whole runs.

Concurrency: the built-in harness (command steps) and the recording proxy (model calls) append to the same
trajectory from different threads or processes. Step numbers are handed out under a row lock on the
trajectory, and if a step arrives late (its start time is earlier than steps already stored) the
trajectory's steps are renumbered so `seq` always follows time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone

from experience.errors import LimitExceeded, NotFound, ValidationError
from experience.models import Step, Trajectory
from experience.records import STEP_KINDS, TRAJECTORY_STATUSES, StepRecord, TrajectoryRecord
from experience.services.blobs import blob_put_many, sha256_hex
from experience.steps import all_blob_contents, blob_refs_for, preview_of, prepare_step

# Steps are renumbered by first moving them out of the way; numbers never reach this in one trajectory.
_RENUMBER_OFFSET = 1_000_000_000


def validate_step(record: StepRecord, *, index: int) -> None:
    where = f"steps[{index}]"
    if record.kind not in STEP_KINDS:
        raise ValidationError(f"{where}.kind: {record.kind!r} is not one of {', '.join(STEP_KINDS)}", field=f"{where}.kind")
    limit = settings.TROVE_MAX_CONTENT_CHARS
    for name in ("text", "output", "response_text", "command"):
        value = getattr(record, name)
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"{where}.{name}: must be text", field=f"{where}.{name}")
        if value is not None and len(value) > limit:
            raise LimitExceeded(f"{where}.{name}: {len(value)} characters exceeds the limit of {limit}", field=f"{where}.{name}")
    if record.started_at and record.ended_at and record.ended_at < record.started_at:
        raise ValidationError(f"{where}.ended_at: earlier than started_at", field=f"{where}.ended_at")


def validate_trajectory(record: TrajectoryRecord) -> None:
    for name in ("source", "source_ref", "task_key"):
        if not getattr(record, name):
            raise ValidationError(f"{name}: required", field=name)
    if record.status not in TRAJECTORY_STATUSES:
        raise ValidationError(f"status: {record.status!r} is not one of {', '.join(TRAJECTORY_STATUSES)}", field="status")
    if len(record.steps) > settings.TROVE_MAX_STEPS_PER_TRAJECTORY:
        raise LimitExceeded(
            f"steps: {len(record.steps)} exceeds the limit of {settings.TROVE_MAX_STEPS_PER_TRAJECTORY} per trajectory",
            field="steps",
        )
    for index, step in enumerate(record.steps):
        validate_step(step, index=index)


def trajectory_open(*, record: TrajectoryRecord) -> Trajectory:
    """Create the trajectory row for a run that is starting (steps come later). Idempotent on source_ref."""
    validate_trajectory(record)
    trajectory, _ = Trajectory.objects.get_or_create(
        source=record.source, source_ref=record.source_ref, defaults=_trajectory_fields(record)
    )
    return trajectory


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


def steps_append(*, trajectory_id: int, steps: Sequence[StepRecord]) -> list[Step]:
    """Append steps in the given order. Idempotent on `call_id`: a call already stored is skipped.

    Validates every step before writing any; writes blobs, then steps, in one transaction.
    """
    for index, step in enumerate(steps):
        validate_step(step, index=index)
    prepared = [prepare_step(step) for step in steps]
    contents = all_blob_contents(prepared)
    digests = blob_put_many(contents)
    digest_of = dict(zip(contents, digests, strict=True))
    try:
        return _insert_steps(trajectory_id, prepared, digest_of)
    except IntegrityError:
        # A concurrent writer stored one of our call ids between our check and insert: retry once,
        # the duplicate is now visible and gets skipped.
        return _insert_steps(trajectory_id, prepared, digest_of)


def _insert_steps(trajectory_id: int, prepared: list, digest_of: dict[bytes, str]) -> list[Step]:
    with transaction.atomic():
        trajectory = _locked(trajectory_id)
        call_ids = [p.record.call_id for p in prepared if p.record.call_id]
        seen = set(
            Step.objects.filter(trajectory_id=trajectory_id, call_id__in=call_ids).values_list("call_id", flat=True)
        ) if call_ids else set()
        fresh = []
        for item in prepared:
            if item.record.call_id and item.record.call_id in seen:
                continue
            if item.record.call_id:
                seen.add(item.record.call_id)
            fresh.append(item)
        if not fresh:
            return []
        if trajectory.next_seq + len(fresh) > settings.TROVE_MAX_STEPS_PER_TRAJECTORY:
            raise LimitExceeded(
                f"trajectory {trajectory_id} would exceed {settings.TROVE_MAX_STEPS_PER_TRAJECTORY} steps",
                field="steps",
            )
        latest = _latest_start(trajectory_id)
        rows = [_step_row(trajectory_id, trajectory.next_seq + i, item, digest_of) for i, item in enumerate(fresh)]
        created = Step.objects.bulk_create(rows)
        trajectory.next_seq += len(rows)
        Trajectory.objects.filter(pk=trajectory_id).update(next_seq=trajectory.next_seq)
        earliest_new = min((r.started_at for r in rows if r.started_at), default=None)
        if latest and earliest_new and earliest_new < latest:
            _renumber_by_time(trajectory_id)
        return created


def _locked(trajectory_id: int) -> Trajectory:
    try:
        return Trajectory.objects.select_for_update().only("id", "next_seq").get(pk=trajectory_id)
    except Trajectory.DoesNotExist:
        raise NotFound(f"trajectory {trajectory_id} does not exist") from None


def _latest_start(trajectory_id: int) -> datetime | None:
    return Step.objects.filter(trajectory_id=trajectory_id).aggregate(m=Max("started_at"))["m"]


def _step_row(trajectory_id: int, seq: int, item, digest_of: dict[bytes, str]) -> Step:
    record: StepRecord = item.record
    duration = record.duration_ms
    if duration is None and record.started_at and record.ended_at:
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
        preview=preview_of(record),
        payload=item.payload,
        blob_refs=blob_refs_for(item, digest_of),
    )


def _renumber_by_time(trajectory_id: int) -> None:
    """Make seq follow started_at (steps without a time keep their relative place). Caller holds the lock."""
    steps = list(Step.objects.filter(trajectory_id=trajectory_id).only("id", "seq", "started_at"))
    ordered = sorted(steps, key=lambda s: (s.started_at or timezone.now(), s.seq))
    if [s.id for s in ordered] == [s.id for s in sorted(steps, key=lambda s: s.seq)]:
        return
    # Move every step out of the way first so no intermediate state violates (trajectory, seq) unique.
    Step.objects.filter(trajectory_id=trajectory_id).update(seq=F("seq") + _RENUMBER_OFFSET)
    for new_seq, step in enumerate(ordered):
        step.seq = new_seq
    Step.objects.bulk_update(ordered, ["seq"], batch_size=500)


def trajectory_finish(
    *,
    trajectory_id: int,
    status: str,
    reward: float | None = None,
    success: bool | None = None,
    final_diff: str | None = None,
    finished_at: datetime | None = None,
) -> Trajectory:
    """Set the outcome and recompute counts and the content hash. Safe to call again (recomputes)."""
    if status not in TRAJECTORY_STATUSES:
        raise ValidationError(f"status: {status!r} is not a trajectory status", field="status")
    with transaction.atomic():
        trajectory = Trajectory.objects.select_for_update().get(pk=trajectory_id)
        trajectory.status = status
        trajectory.reward = reward
        trajectory.success = success
        if final_diff is not None:
            trajectory.final_diff = final_diff
        trajectory.finished_at = finished_at or timezone.now()
        _recount(trajectory)
        trajectory.save()
    return trajectory


def _recount(trajectory: Trajectory) -> None:
    totals = Step.objects.filter(trajectory_id=trajectory.pk).aggregate(
        n=Count("id"),
        calls=Count("id", filter=Q(kind="model_call")),
        tin=Sum("tokens_in"),
        tout=Sum("tokens_out"),
    )
    trajectory.n_steps = totals["n"] or 0
    trajectory.n_model_calls = totals["calls"] or 0
    trajectory.tokens_in = totals["tin"] or 0
    trajectory.tokens_out = totals["tout"] or 0
    if trajectory.started_at and trajectory.finished_at:
        trajectory.duration_s = (trajectory.finished_at - trajectory.started_at).total_seconds()
    trajectory.content_hash = _action_hash(trajectory)


def _action_hash(trajectory: Trajectory) -> str:
    """sha256 of the ordered actions (commands, tool calls) and the task: equal runs hash equal."""
    digest = hashlib.sha256(trajectory.task_key.encode())
    actions = Step.objects.filter(trajectory_id=trajectory.pk, kind__in=("command", "tool_call")).order_by("seq")
    for payload in actions.values_list("payload", flat=True):
        digest.update(b"\x00" + str(payload.get("command") or payload.get("tool_calls") or "").encode())
    return digest.hexdigest()


def trajectory_ingest(*, record: TrajectoryRecord, original: bytes | None = None) -> tuple[Trajectory, bool]:
    """Store a whole finished run (import or API). All or nothing; a run already stored is left as is.

    Returns (trajectory, created).
    """
    validate_trajectory(record)
    existing = Trajectory.objects.filter(source=record.source, source_ref=record.source_ref).first()
    if existing:
        return existing, False
    with transaction.atomic():
        fields = _trajectory_fields(record)
        if original is not None:
            fields["original_blob"] = blob_put_many([original])[0]
        trajectory = Trajectory.objects.create(source=record.source, source_ref=record.source_ref, **fields)
        if record.steps:
            steps_append(trajectory_id=trajectory.pk, steps=record.steps)
        trajectory.refresh_from_db()
        _recount(trajectory)
        trajectory.save()
    return trajectory, True


__all__ = [
    "sha256_hex",
    "steps_append",
    "trajectory_finish",
    "trajectory_ingest",
    "trajectory_open",
    "validate_step",
    "validate_trajectory",
]
