"""Rollout jobs and rollouts in the database: creating jobs, the rollout state machine, planning the next
samples (webapp/rollouts/sampling.py decides which), cancel, re-run, job completion.

Every state change is a conditional UPDATE (`... WHERE status IN (...)`), so a redelivered Celery task, a
reaper and a worker can race without ever moving a rollout twice. A rollout reaching a final status also
takes its job's row lock (lock order: the job, then its rollouts): under it the rollout gets its place in the
job's finish order (`finish_seq`, the trainer's cursor) and the job's next samples are planned, so the
budget is counted by one transaction at a time. Tasks are enqueued after commit.

Concurrency is a hard limit on a job's running rollouts, whatever the number of workers. Two parts:
- The start (rollout_start) takes the job's row lock and claims the rollout only while fewer than
  `concurrency` of the job's rollouts are running; the count is in the claim's own UPDATE too. Every move
  to `running` goes through it and every move out of `running` only lowers the count, so the limit holds
  on Postgres (the lock serialises the starts of a job) and on SQLite (one writer at a time). A start that
  finds the job full is deferred: the rollout stays queued, its attempt is not counted, and its message is
  dropped (`sent_at` cleared: it waits for a slot).
- Messages (`_dispatch_locked`): a rollout is sent to the broker only when the job has a slot for it, so a
  job's messages in flight plus its running rollouts never exceed its concurrency. A rollout without a
  message (`sent_at` NULL) waits; whoever frees a slot under the job's lock (a finish, a cancel) sends the
  next one, so none waits forever and none is lost. The reaper re-sends what the broker may have lost
  (rollouts_resend_due) and sends what an admin's raised limit made room for (jobs_dispatch_waiting).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Max, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan
from django.utils import timezone

from experience.errors import Conflict, NotFound, ValidationError
from experience.models import Trajectory
from experience.services.ingest import trajectory_finish
from webapp.fleets.models import Fleet
from webapp.fleets.services import RELAXED_CTE
from webapp.rollouts import sampling, selectors
from webapp.rollouts.endpoints import endpoint_get_by_name, endpoint_model
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, Task, TaskSet, new_rollout_token

log = logging.getLogger("trove.rollouts")
R = Rollout.Status
RUN_TASK = "trove.rollouts.run"  # workers/tasks/rollouts.py registers it under this stable name
Enqueue = Callable[[int], None]


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


def enqueue_by_name(rollout_id: int) -> None:
    """Send `trove.rollouts.run` by name: webapp code may not import the worker's task module."""
    from webapp.celery import app

    app.send_task(RUN_TASK, args=(rollout_id,))


def _check_job_options(*, samples_per_task: int, options: dict) -> None:
    if samples_per_task < 1:
        raise ValidationError("samples_per_task: must be at least 1", field="samples_per_task")
    if options.get("sampling", sampling.UNIFORM) not in sampling.POLICIES:
        raise ValidationError(f"sampling: must be one of {', '.join(sampling.POLICIES)}", field="sampling")
    for name in ("concurrency", "adaptive_first_round", "max_steps", "wall_time_s"):
        if name in options and options[name] < 1:
            raise ValidationError(f"{name}: must be at least 1", field=name)


def _job_tasks(task_set: TaskSet, task_keys: list[str] | None) -> list[Task]:
    tasks = list(task_set.tasks.all())
    if task_keys is not None:
        unknown = set(task_keys) - {task.key for task in tasks}
        if unknown:
            raise ValidationError(f"task_keys: not in {task_set.name!r}: {', '.join(sorted(unknown))}", field="task_keys")
        tasks = [task for task in tasks if task.key in set(task_keys)]
    if not tasks:
        raise ValidationError(f"task_set: {task_set.name!r} has no tasks", field="task_set")
    return tasks


def job_create(
    *,
    task_set: TaskSet,
    fleet,
    endpoint: ModelEndpoint,
    model_name: str = "",
    samples_per_task: int = 1,
    enqueue: Enqueue | None = None,
    task_keys: list[str] | None = None,
    **options,
) -> RolloutJob:
    """Create a job and its first rollouts: all of them (uniform) or the first round (adaptive).

    Each rollout is enqueued (by id) only after the transaction commits; `enqueue` defaults to sending the
    Celery task by name. An adaptive job's later rollouts are created as earlier ones finish. The job's
    model calls go to `endpoint` (a registered one) for `model_name` (default: the endpoint's first model).
    """
    _check_job_options(samples_per_task=samples_per_task, options=options)
    model_name = endpoint_model(endpoint, model_name)
    tasks = _job_tasks(task_set, task_keys)
    with transaction.atomic():
        job = RolloutJob.objects.create(
            task_set=task_set, fleet=fleet, endpoint=endpoint, model_name=model_name,
            samples_per_task=samples_per_task, **options,
        )
        first = selectors.job_policy(job).first_round_size
        _create_rollouts(job, [Rollout(job=job, task=task, sample_index=i) for task in tasks for i in range(first)],
                         enqueue)
    return job


def job_submit(*, task_set_name: str, fleet_name: str, endpoint_name: str, created_by=None,
               enqueue: Enqueue | None = None, **fields) -> RolloutJob:
    """A job from names (the trainer API's way in): resolve the task set, the fleet and the model endpoint,
    then job_create."""
    task_set = selectors.taskset_get_by_name(name=task_set_name)
    fleet = Fleet.objects.filter(name=fleet_name).first()
    if fleet is None:
        raise NotFound(f"fleet: no fleet named {fleet_name!r}", field="fleet")
    endpoint = endpoint_get_by_name(name=endpoint_name)
    return job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, created_by=created_by, enqueue=enqueue,
                      **fields)


def _create_rollouts(job: RolloutJob, rollouts: list[Rollout], enqueue: Enqueue | None) -> list[int]:
    """Insert rollouts, waiting for a slot (no message yet), and send those the job has slots for (after
    commit). Caller is inside a transaction and holds the job's row lock (or created the job in it)."""
    if not rollouts:
        return []
    created = Rollout.objects.bulk_create(rollouts)
    ids = [r.pk for r in created]
    if None in ids:  # a backend without RETURNING
        ids = list(job.rollouts.order_by("-id").values_list("pk", flat=True)[: len(rollouts)])[::-1]
    _dispatch_locked(job, enqueue)
    return ids


def _dispatch_locked(job: RolloutJob, enqueue: Enqueue | None) -> list[int]:
    """Send (after commit) the job's waiting rollouts its free slots allow. Caller holds the job's row lock,
    so two finishes never give the same slot away twice. Returns the ids sent."""
    return _send_waiting(job, _slots(job), enqueue)


def _slots(job: RolloutJob) -> dict[str, int]:
    """The job's open rollouts in one query: `taken` (running, or queued with a message out) and `waiting`
    (queued without a message)."""
    return Rollout.objects.filter(job_id=job.pk, status__in=selectors.OPEN).aggregate(
        taken=Count("id", filter=Q(status=R.RUNNING) | Q(sent_at__isnull=False)),
        waiting=Count("id", filter=Q(sent_at__isnull=True) & ~Q(status=R.RUNNING)),
    )


def _send_waiting(job: RolloutJob, slots: dict[str, int], enqueue: Enqueue | None) -> list[int]:
    """Send as many waiting rollouts as the job's concurrency leaves room for, first samples first (every
    task gets going before any task repeats). Caller holds the job's row lock."""
    free = min(slots["waiting"], job.concurrency - slots["taken"])
    if free <= 0:
        return []
    waiting = Rollout.objects.filter(job_id=job.pk, status=R.QUEUED, sent_at__isnull=True)
    ids = list(waiting.order_by("sample_index", "id").values_list("pk", flat=True)[:free])
    Rollout.objects.filter(pk__in=ids, status=R.QUEUED).update(sent_at=timezone.now())
    send = enqueue or enqueue_by_name
    transaction.on_commit(lambda: [send(rollout_id) for rollout_id in ids])
    return ids


def jobs_dispatch_waiting(*, enqueue: Enqueue | None = None) -> int:
    """Send the waiting rollouts of open jobs that have free slots (after an admin raised a job's
    concurrency, say: no finish frees a slot then). Each job under its row lock. Returns how many were sent."""
    job_ids = (Rollout.objects.filter(status=R.QUEUED, sent_at__isnull=True, job__status__in=selectors.JOB_OPEN)
               .order_by().values_list("job_id", flat=True).distinct())
    sent = 0
    for job_id in list(job_ids):
        with transaction.atomic():
            job = _lock_job(job_id)
            if job.status in selectors.JOB_OPEN:
                sent += len(_dispatch_locked(job, enqueue))
    return sent


def rollout_start(*, rollout_id: int, worker: str,
                  open_trajectory: Callable[[Rollout], Trajectory] | None = None) -> Rollout | None:
    """queued -> running, claimed by `worker`, if the job has a slot (module docstring). None if someone else
    has it, it is already finished, or the job is at its concurrency (then the start is deferred: the
    rollout waits for a slot, queued, its attempt not counted, and is sent again when one frees).

    With `open_trajectory`, the attempt's trajectory (made by it from the claimed rollout) and a new proxy
    token are set in the same transaction as the claim: one commit for the whole start. The claim is
    conditional on the rollout still being queued at the attempt read, so a duplicate message (a re-send, a
    redelivery) finds nothing to do, and its trajectory is rolled back with its failed claim; a trajectory
    of the same attempt opened first by another worker (IntegrityError) means the same.
    """
    rollout = (Rollout.objects.select_related("job", "job__task_set", "task", "job__fleet", "job__fleet__template",
                                              "job__endpoint")
               .filter(pk=rollout_id, status=R.QUEUED).first())
    if rollout is None:
        return None
    attempt = rollout.attempt
    try:
        with transaction.atomic():
            # Lock order: the job, then its rollouts (the trajectory opened below is a new row no one waits on).
            running = _lock_job_for_start(rollout.job_id)
            if running >= rollout.job.concurrency:
                _defer(rollout, attempt, running)
                return None
            # Taken under the lock, so a rollout never starts before the finish that freed its slot.
            now = timezone.now()
            rollout.status, rollout.worker, rollout.heartbeat_at, rollout.started_at = R.RUNNING, worker, now, now
            rollout.attempt = attempt + 1
            return rollout if _claim(rollout, attempt, open_trajectory) else None
    except IntegrityError:  # another worker opened this attempt first: the rollout is theirs
        return None


def _running_count(job_id: int) -> Coalesce:
    """The job's running rollouts, as a subquery."""
    rows = (Rollout.objects.filter(job_id=job_id, status=R.RUNNING).order_by().values("job_id")
            .annotate(n=Count("id")).values("n"))
    return Coalesce(Subquery(rows[:1]), 0)


def _lock_job_for_start(job_id: int) -> int:
    """Take the job's row lock, then count its running rollouts. Every start and finish of the job waits for
    the lock, so the count cannot change until this transaction ends. Two statements, not one: a count in
    the locking SELECT would be read from the snapshot taken before it waited for the lock (READ COMMITTED),
    missing the claims committed meanwhile."""
    RolloutJob.objects.select_for_update().filter(pk=job_id).values_list("pk", flat=True).get()
    return Rollout.objects.filter(job_id=job_id, status=R.RUNNING).count()


def _defer(rollout: Rollout, attempt: int, running: int) -> None:
    """The job is full: drop this message (sent_at cleared, the rollout waits for a slot); the transaction
    that frees a slot sends it again. Caller holds the job's row lock, so no slot frees in between."""
    Rollout.objects.filter(pk=rollout.pk, status=R.QUEUED, attempt=attempt).update(sent_at=None)
    log.info("rollout %s deferred: job %s has %s running, its concurrency is %s", rollout.pk, rollout.job_id,
             running, rollout.job.concurrency)


def _claim(rollout: Rollout, attempt: int, open_trajectory: Callable[[Rollout], Trajectory] | None) -> bool:
    claim: dict[str, Any] = {"status": R.RUNNING, "worker": rollout.worker, "heartbeat_at": rollout.started_at,
             "started_at": rollout.started_at, "attempt": attempt + 1}
    if open_trajectory is not None:
        # Only the hash is stored; the plaintext rides on the claimed object to the runner's harness.
        rollout.proxy_token, rollout.token = new_rollout_token()  # type: ignore[attr-defined]
        rollout.trajectory = open_trajectory(rollout)
        claim.update(trajectory=rollout.trajectory, token=rollout.token)
    # The limit is part of the claim itself (the caller's lock makes the count current on Postgres).
    within_limit = LessThan(_running_count(rollout.job_id), rollout.job.concurrency)
    if not Rollout.objects.filter(within_limit, pk=rollout.pk, status=R.QUEUED, attempt=attempt).update(**claim):
        transaction.set_rollback(True)
        return False
    if rollout.job.status == RolloutJob.Status.QUEUED:  # only the job's first rollout pays for this
        RolloutJob.objects.filter(pk=rollout.job_id, status=RolloutJob.Status.QUEUED).update(
            status=RolloutJob.Status.RUNNING, started_at=rollout.started_at
        )
    return True


def rollout_heartbeat(*, rollout_id: int, worker: str) -> bool:
    """False when the rollout is no longer this worker's (cancelled, reaped): the worker must stop."""
    return bool(
        Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker).update(heartbeat_at=timezone.now())
    )


def rollout_finish(*, rollout_id: int, worker: str, status: str, enqueue: Enqueue | None = None,
                   job_id: int | None = None, **fields) -> bool:
    """running -> a final status, only if this worker still holds it. Then plan the job's next samples and
    maybe complete it. Runs under the job's row lock, so two rollouts finishing at once are planned one
    after the other and never spend the same budget twice. `job_id`, when the caller knows it, saves a read."""
    if status not in Rollout.FINISHED:
        raise ValidationError(f"status: {status!r} is not a final rollout status", field="status")
    if job_id is None:
        job_id = Rollout.objects.filter(pk=rollout_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return False
    with transaction.atomic(savepoint=False):  # in a caller's transaction (the runner's last commit): part of it
        job = _lock_job(job_id)
        done = _finish_one(Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker, job_id=job_id),
                           job_id=job_id, status=status, **fields)
        if done:
            _refresh_locked(job, enqueue)
    return done


def _lock_job(job_id: int) -> RolloutJob:
    """Take the job's row lock for the rest of the transaction. Lock order: the job, then its rollouts."""
    return RolloutJob.objects.select_for_update().get(pk=job_id)


def _next_finish_seq(job_id: int) -> int:
    """Caller holds the job's row lock, so no other transaction can take the same number."""
    top = Rollout.objects.filter(job_id=job_id).aggregate(top=Max("finish_seq"))["top"]
    return (top or 0) + 1


def _finish_one(rollouts: QuerySet[Rollout], *, job_id: int, status: str, **fields) -> bool:
    """Conditional update of at most one rollout to a final status. Caller holds the job's row lock, so the
    next finish number, computed inside the same statement, is taken by no one else."""
    top = Rollout.objects.filter(job_id=job_id).order_by().values("job_id").annotate(top=Max("finish_seq"))
    next_seq = Coalesce(Subquery(top.values("top")[:1]), 0) + 1
    return bool(rollouts.update(status=status, finished_at=timezone.now(), finish_seq=next_seq, **fields))


def rollout_requeue(*, rollout_id: int, worker: str, error: str) -> bool:
    """running -> queued for another attempt (transient failure), only if this worker still holds it. The
    caller sends it again (after commit)."""
    return bool(
        Rollout.objects.filter(pk=rollout_id, status=R.RUNNING, worker=worker).update(
            status=R.QUEUED, worker="", error=error, sandbox=None, trajectory=None, sent_at=timezone.now()
        )
    )


def rollout_set_sandbox(*, rollout_id: int, sandbox_id: int) -> None:
    """Point the rollout at the sandbox it leased (for the reaper). Observational: the lease itself guards
    the sandbox, so on Postgres, outside a transaction, it is one statement that commits without waiting
    for the WAL flush (as webapp.fleets.services.relaxed_commit, in one round trip instead of four)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        Rollout.objects.filter(pk=rollout_id).update(sandbox_id=sandbox_id)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {RELAXED_CTE} UPDATE {Rollout._meta.db_table} SET sandbox_id = %s FROM relaxed WHERE id = %s",
            [sandbox_id, rollout_id],
        )


def rollouts_stale(*, now=None) -> list[Rollout]:
    """Running rollouts whose worker stopped heartbeating (it died or lost the broker)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TROVE_ROLLOUT_STALE_S)
    return list(Rollout.objects.filter(status=R.RUNNING, heartbeat_at__lt=cutoff).select_related("sandbox"))


def rollouts_resend_due(*, now=None, limit: int = 1000) -> list[int]:
    """Queued rollouts of open jobs whose message went out more than TROVE_ROLLOUT_RESEND_S ago (sent_at):
    the caller sends each again, in case the broker lost it. Marks them
    sent now in the same transaction (rows locked, skipping those another reaper holds), so each is re-sent
    at most once per interval. A duplicate message is harmless: the start is a conditional claim."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TROVE_ROLLOUT_RESEND_S)
    # A rollout waiting for a slot (sent_at NULL) has no message to lose: the finish that frees a slot sends it.
    due = Rollout.objects.filter(status=R.QUEUED, job__status__in=selectors.JOB_OPEN, sent_at__lte=cutoff)
    with transaction.atomic():
        ids = list(due.select_for_update(skip_locked=True, of=("self",)).order_by("id").values_list("pk", flat=True)[:limit])
        Rollout.objects.filter(pk__in=ids, status=R.QUEUED).update(sent_at=now)
    return ids


def rollout_reap(*, rollout: Rollout, enqueue: Enqueue | None = None) -> str:
    """Take a stale rollout back: requeue it if attempts remain, else mark infra_error. Returns the new status.

    Conditional on the stale heartbeat still being there, so a worker that was only slow keeps its rollout.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.TROVE_ROLLOUT_STALE_S)
    base = Rollout.objects.filter(pk=rollout.pk, status=R.RUNNING, heartbeat_at__lt=cutoff)
    error = f"worker {rollout.worker or '?'} stopped heartbeating (attempt {rollout.attempt})"
    if rollout.attempt < settings.TROVE_ROLLOUT_MAX_ATTEMPTS:
        requeued = base.update(status=R.QUEUED, worker="", error=error, sandbox=None, trajectory=None,
                               sent_at=timezone.now())
        outcome = R.QUEUED if requeued else None
    else:
        with transaction.atomic():
            job = _lock_job(rollout.job_id)
            outcome = R.INFRA_ERROR if _finish_one(base, job_id=rollout.job_id, status=R.INFRA_ERROR, error=error) else None
            if outcome:
                _refresh_locked(job, enqueue)
    if outcome is None:
        return R.RUNNING
    _abandon_trajectory(rollout.trajectory_id)
    return outcome


def _abandon_trajectory(trajectory_id: int | None) -> None:
    """The attempt's partial trajectory stays (it is evidence) but is marked infra_error, out of training data."""
    if trajectory_id:
        trajectory_finish(trajectory_id=trajectory_id, status="infra_error")


def job_progress(*, job: RolloutJob) -> dict:
    """Kept here for its callers; a read, see selectors.job_progress."""
    return selectors.job_progress(job=job)


def job_refresh(*, job_id: int, enqueue: Enqueue | None = None) -> list[int]:
    """Plan the job's next samples, and complete it once it has nothing open and nothing left to spend.

    Idempotent. Returns the ids of the rollouts it created (adaptive jobs only).
    """
    with transaction.atomic():
        return _refresh_locked(_lock_job(job_id), enqueue)


def _refresh_locked(job: RolloutJob, enqueue: Enqueue | None) -> list[int]:
    """`job` as read under its row lock (by _lock_job, in the caller's transaction)."""
    if job.status not in selectors.JOB_OPEN:
        return []  # cancelled or completed: spend nothing more
    created = _plan_locked(job, enqueue)  # sends what it creates, as far as the job has slots
    if created:
        return created
    slots = _slots(job)
    if slots["taken"] + slots["waiting"] == 0:
        RolloutJob.objects.filter(pk=job.pk, status__in=selectors.JOB_OPEN).update(
            status=RolloutJob.Status.COMPLETED, finished_at=timezone.now())
    else:  # a rollout finished or was cancelled: its slot goes to the next one waiting
        _send_waiting(job, slots, enqueue)
    return created


def job_plan_next(*, job: RolloutJob, enqueue: Enqueue | None = None) -> list[int]:
    """Create and enqueue (after commit) the job's next rollouts under its sampling policy.

    Idempotent and safe to call from any number of finishing rollouts at once: it holds the job's row lock
    while it counts what was spent, so the budget is never over-spent. Returns the new rollout ids.
    """
    with transaction.atomic():
        job = _lock_job(job.pk)
        if job.status not in selectors.JOB_OPEN:
            return []
        return _plan_locked(job, enqueue)


def _plan_locked(job: RolloutJob, enqueue: Enqueue | None) -> list[int]:
    if job.sampling != sampling.ADAPTIVE:
        return []  # a uniform job issued every sample at creation: no tallies to read on each finish
    tallies, top_index = selectors.job_tallies(job_id=job.pk)
    slots = job.concurrency - sum(t.open for t in tallies)
    picks = sampling.plan(tallies, selectors.job_policy(job), slots=slots)
    if not picks:
        return []
    rollouts = []
    for task_id in picks:
        top_index[task_id] = top_index.get(task_id, -1) + 1
        rollouts.append(Rollout(job=job, task_id=task_id, sample_index=top_index[task_id]))
    return _create_rollouts(job, rollouts, enqueue)


def job_cancel(*, job: RolloutJob) -> int:
    """Cancel the job: its queued and running rollouts end as cancelled (a running one's worker sees it at
    its next heartbeat and stops) and nothing more is planned. Returns how many rollouts changed."""
    with transaction.atomic():
        _lock_job(job.pk)
        # Locking the rows keeps a worker from starting one of them between our read and our write.
        open_rollouts = list(job.rollouts.select_for_update().filter(status__in=selectors.OPEN).order_by("id"))
        seq, now = _next_finish_seq(job.pk), timezone.now()
        for offset, rollout in enumerate(open_rollouts):
            rollout.status, rollout.finished_at, rollout.finish_seq = R.CANCELLED, now, seq + offset
        Rollout.objects.bulk_update(open_rollouts, ["status", "finished_at", "finish_seq"], batch_size=500)
        RolloutJob.objects.filter(pk=job.pk, status__in=selectors.JOB_OPEN).update(
            status=RolloutJob.Status.CANCELLED, finished_at=now)
    job.refresh_from_db()
    return len(open_rollouts)


def rollout_cancel(*, rollout: Rollout, enqueue: Enqueue | None = None) -> bool:
    """Cancel one queued or running rollout. The job goes on (an adaptive one may plan another sample; the
    cancelled one still counts as spent). False if it had already finished."""
    with transaction.atomic():
        job = _lock_job(rollout.job_id)
        done = _finish_one(Rollout.objects.filter(pk=rollout.pk, status__in=selectors.OPEN),
                           job_id=rollout.job_id, status=R.CANCELLED)
        if done:
            _refresh_locked(job, enqueue)
    rollout.refresh_from_db()
    return done


RERUNNABLE = (R.FAILED, R.INFRA_ERROR)


def job_rerun_failed(*, job: RolloutJob, statuses: Iterable[str] = RERUNNABLE,
                     enqueue: Enqueue | None = None) -> list[Rollout]:
    """Run again, in the same job, every sample that ended in one of `statuses` and was not re-run yet.

    Each new rollout gets the task's next sample index and points back at the one it re-runs (`rerun_of`);
    the old rows stay as they are (evidence; infra errors never become training data). The job reopens, so a
    trainer following its finished-rollouts cursor picks the new outcomes up with no change on its side.
    Re-runs are spent on top of the budget. Only for a job that has finished (Conflict otherwise).
    """
    statuses = tuple(statuses)
    if not statuses or set(statuses) - set(RERUNNABLE):
        raise ValidationError(f"statuses: choose from {', '.join(RERUNNABLE)}", field="statuses")
    with transaction.atomic():
        job = _lock_job(job.pk)
        if job.status in selectors.JOB_OPEN:
            raise Conflict(f"job {job.pk} is still {job.status}: re-run its failed samples once it has finished",
                           field="status")
        failed = list(job.rollouts.filter(status__in=statuses, reruns__isnull=True).order_by("id"))
        if not failed:
            return []
        _, top_index = selectors.job_tallies(job_id=job.pk)
        rollouts = []
        for old in failed:
            top_index[old.task_id] += 1
            rollouts.append(Rollout(job=job, task_id=old.task_id, sample_index=top_index[old.task_id], rerun_of=old))
        ids = _create_rollouts(job, rollouts, enqueue)
        RolloutJob.objects.filter(pk=job.pk).update(status=RolloutJob.Status.RUNNING, finished_at=None)
    return list(Rollout.objects.filter(pk__in=ids).order_by("id"))



def job_get(*, job_id: int) -> RolloutJob:
    """Kept here for its callers; a read, see selectors.job_get."""
    return selectors.job_get(job_id=job_id)
