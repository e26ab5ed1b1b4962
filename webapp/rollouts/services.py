"""Rollout jobs and rollouts in the database: creating jobs, the rollout state machine, job completion.

Every state change is a conditional UPDATE (`... WHERE status IN (...)`), so a redelivered Celery task, a
reaper and a worker can race without ever moving a rollout twice. Tasks are enqueued after commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from experience.errors import NotFound, ValidationError
from experience.services.ingest import trajectory_finish
from webapp.env import env_str
from webapp.rollouts.models import Rollout, RolloutJob, Task, TaskSet

log = logging.getLogger("trove.rollouts")
R = Rollout.Status


def taskset_upsert(*, name: str, description: str, source: str, tasks: Iterable[dict]) -> TaskSet:
    """Create or update a task set from task dicts (key, instruction, eval_command, files, ...). Atomic."""
    task_fields = {f.name for f in Task._meta.get_fields()} - {"id", "task_set", "rollouts"}
    with transaction.atomic():
        task_set, _ = TaskSet.objects.update_or_create(
            name=name, defaults={"description": description, "source": source}
        )
        for index, task in enumerate(tasks):
            for required in ("key", "instruction", "eval_command"):
                if not task.get(required):
                    raise ValidationError(f"tasks[{index}].{required}: required", field=f"tasks[{index}].{required}")
            defaults = {k: v for k, v in task.items() if k in task_fields and k != "key"}
            Task.objects.update_or_create(task_set=task_set, key=task["key"], defaults=defaults)
    return task_set


def resolve_api_key(reference: str) -> str:
    """Turn a secret reference (`env:NAME`, `file:/path`, or empty) into the key. Never store the result."""
    if not reference:
        return ""
    scheme, _, target = reference.partition(":")
    if scheme == "env":
        return env_str(target) or ""
    if scheme == "file":
        with open(target) as handle:
            return handle.read().strip()
    raise ValidationError(f"api_key_ref: {reference!r} must look like env:NAME or file:/path", field="api_key_ref")


def _check_secret_reference(reference: str) -> None:
    scheme = reference.partition(":")[0]
    if scheme not in ("env", "file"):
        raise ValidationError(f"api_key_ref: {reference!r} must look like env:NAME or file:/path", field="api_key_ref")


def job_create(
    *,
    task_set: TaskSet,
    fleet,
    model_base_url: str,
    model_name: str,
    samples_per_task: int = 1,
    enqueue: Callable[[int], None],
    task_keys: list[str] | None = None,
    **options,
) -> RolloutJob:
    """Create a job and its rollouts; each rollout is enqueued (by id) only after the transaction commits."""
    if samples_per_task < 1:
        raise ValidationError("samples_per_task: must be at least 1", field="samples_per_task")
    if not model_base_url.startswith(("http://", "https://")):
        raise ValidationError("model_base_url: must be an http(s) URL", field="model_base_url")
    if options.get("api_key_ref"):
        _check_secret_reference(options["api_key_ref"])
    tasks = list(task_set.tasks.all())
    if task_keys is not None:
        unknown = set(task_keys) - {task.key for task in tasks}
        if unknown:
            raise ValidationError(f"task_keys: not in {task_set.name!r}: {', '.join(sorted(unknown))}", field="task_keys")
        tasks = [task for task in tasks if task.key in set(task_keys)]
    if not tasks:
        raise ValidationError(f"task_set: {task_set.name!r} has no tasks", field="task_set")
    with transaction.atomic():
        job = RolloutJob.objects.create(
            task_set=task_set, fleet=fleet, model_base_url=model_base_url, model_name=model_name,
            samples_per_task=samples_per_task, **options,
        )
        rollouts = Rollout.objects.bulk_create(
            [Rollout(job=job, task=task, sample_index=i) for task in tasks for i in range(samples_per_task)]
        )
        ids = [r.pk for r in rollouts] if rollouts[0].pk else list(job.rollouts.values_list("pk", flat=True))
        transaction.on_commit(lambda: [enqueue(rollout_id) for rollout_id in ids])
    return job


def rollout_start(*, rollout_id: int, worker: str) -> Rollout | None:
    """queued -> running, claimed by `worker`. None if someone else has it or it is already finished."""
    now = timezone.now()
    claimed = Rollout.objects.filter(pk=rollout_id, status=R.QUEUED).update(
        status=R.RUNNING, worker=worker, heartbeat_at=now, started_at=now, attempt=F("attempt") + 1,
    )
    if not claimed:
        return None
    rollout = Rollout.objects.select_related("job", "task", "job__fleet", "job__fleet__template").get(pk=rollout_id)
    RolloutJob.objects.filter(pk=rollout.job_id, status=RolloutJob.Status.QUEUED).update(
        status=RolloutJob.Status.RUNNING, started_at=now
    )
    return rollout


def rollout_heartbeat(*, rollout_id: int, worker: str) -> bool:
    """False when the rollout is no longer this worker's (cancelled, reaped): the worker must stop."""
    return bool(
        Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker).update(heartbeat_at=timezone.now())
    )


def rollout_finish(*, rollout_id: int, worker: str, status: str, **fields) -> bool:
    """running -> a final status, only if this worker still holds it. Then maybe complete the job."""
    if status not in Rollout.FINISHED:
        raise ValidationError(f"status: {status!r} is not a final rollout status", field="status")
    done = Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker).update(
        status=status, finished_at=timezone.now(), **fields
    )
    if done:
        job_id = Rollout.objects.values_list("job_id", flat=True).get(pk=rollout_id)
        job_refresh(job_id=job_id)
    return bool(done)


def rollout_requeue(*, rollout_id: int, worker: str, error: str) -> bool:
    """running -> queued for another attempt (transient failure), only if this worker still holds it."""
    return bool(
        Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker).update(
            status=R.QUEUED, worker="", error=error, sandbox=None, trajectory=None
        )
    )


def rollouts_stale(*, now=None) -> list[Rollout]:
    """Running rollouts whose worker stopped heartbeating (it died or lost the broker)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TROVE_ROLLOUT_STALE_S)
    return list(Rollout.objects.filter(status=R.RUNNING, heartbeat_at__lt=cutoff).select_related("sandbox"))


def rollout_reap(*, rollout: Rollout) -> str:
    """Take a stale rollout back: requeue it if attempts remain, else mark infra_error. Returns the new status.

    Conditional on the stale heartbeat still being there, so a worker that was only slow keeps its rollout.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.TROVE_ROLLOUT_STALE_S)
    base = Rollout.objects.filter(pk=rollout.pk, status=R.RUNNING, heartbeat_at__lt=cutoff)
    error = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempt})"
    if rollout.attempt < settings.TROVE_ROLLOUT_MAX_ATTEMPTS:
        outcome = R.QUEUED if base.update(status=R.QUEUED, worker="", error=error, sandbox=None, trajectory=None) else None
    else:
        outcome = R.INFRA_ERROR if base.update(status=R.INFRA_ERROR, error=error, finished_at=timezone.now()) else None
    if outcome is None:
        return R.RUNNING
    _abandon_trajectory(rollout.trajectory_id)
    if outcome == R.INFRA_ERROR:
        job_refresh(job_id=rollout.job_id)
    return outcome


def _abandon_trajectory(trajectory_id: int | None) -> None:
    """The attempt's partial trajectory stays (it is evidence) but is marked infra_error, out of training data."""
    if trajectory_id:
        trajectory_finish(trajectory_id=trajectory_id, status="infra_error")


def job_progress(*, job: RolloutJob) -> dict:
    counts = dict(job.rollouts.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    total = sum(counts.values())
    finished = sum(counts.get(s, 0) for s in Rollout.FINISHED)
    return {"total": total, "finished": finished, "by_status": counts,
            "percent": round(100 * finished / total) if total else 0}


def job_refresh(*, job_id: int) -> None:
    """Complete the job once none of its rollouts is queued or running. Idempotent."""
    open_rollouts = Rollout.objects.filter(job_id=job_id, status__in=(R.QUEUED, R.RUNNING)).exists()
    if open_rollouts:
        return
    RolloutJob.objects.filter(
        pk=job_id, status__in=(RolloutJob.Status.QUEUED, RolloutJob.Status.RUNNING)
    ).update(status=RolloutJob.Status.COMPLETED, finished_at=timezone.now())


def job_cancel(*, job: RolloutJob) -> int:
    """Cancel queued rollouts now; running ones see it at their next heartbeat. Returns how many changed."""
    with transaction.atomic():
        cancelled = job.rollouts.filter(status=R.QUEUED).update(status=R.CANCELLED, finished_at=timezone.now())
        running = job.rollouts.filter(status=R.RUNNING).update(status=R.CANCELLED, finished_at=timezone.now())
        RolloutJob.objects.filter(pk=job.pk).exclude(status=RolloutJob.Status.COMPLETED).update(
            status=RolloutJob.Status.CANCELLED, finished_at=timezone.now()
        )
    return cancelled + running


def rollout_by_token(token: str) -> Rollout | None:
    """The running rollout a proxy token belongs to; None for unknown or finished rollouts."""
    return (
        Rollout.objects.filter(token=token, status=R.RUNNING)
        .select_related("job")
        .only("id", "trajectory_id", "job__model_base_url", "job__model_name", "job__api_key_ref")
        .first()
    )


def job_get(*, job_id: int) -> RolloutJob:
    try:
        return RolloutJob.objects.select_related("task_set", "fleet").get(pk=job_id)
    except RolloutJob.DoesNotExist:
        raise NotFound(f"job {job_id} does not exist") from None

