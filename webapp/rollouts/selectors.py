"""Reads for jobs, rollouts and task sets. Each does a fixed number of queries, whatever the job's size."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Max, Q, QuerySet

from experience.errors import NotFound
from webapp.rollouts import sampling
from webapp.rollouts.models import Rollout, RolloutJob, Task, TaskSet

R = Rollout.Status
OPEN = (R.QUEUED, R.RUNNING)
JOB_OPEN = (RolloutJob.Status.QUEUED, RolloutJob.Status.RUNNING)


def job_policy(job: RolloutJob) -> sampling.Policy:
    return sampling.Policy(name=job.sampling, samples_per_task=job.samples_per_task,
                           first_round=job.adaptive_first_round)


def job_tallies(*, job_id: int) -> tuple[list[sampling.TaskTally], dict[int, int]]:
    """Per-task tallies of a job (one query), and each task's highest sample index so far."""
    rows = (Rollout.objects.filter(job_id=job_id).values_list("task_id", "status")
            .annotate(n=Count("id"), top=Max("sample_index"), started=Count("started_at")).order_by())
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    started: dict[int, int] = defaultdict(int)
    top_index: dict[int, int] = {}
    for task_id, status, n, top, n_started in rows:
        counts[task_id][status] = n
        started[task_id] += count_started(status, n_started)
        top_index[task_id] = max(top, top_index.get(task_id, -1))
    return [tally_from_counts(task_id, by_status, started=started[task_id])
            for task_id, by_status in sorted(counts.items())], top_index


def count_started(status: str, n_started: int) -> int:
    """How many of `n_started` rollouts with a start time in `status` count as issued to a worker: none
    while queued (a requeued one waits to run again, its earlier start is no longer its own)."""
    return 0 if status == R.QUEUED else n_started


def tally_from_counts(task_id: int, by_status: dict[str, int], *, started: int = 0) -> sampling.TaskTally:
    return sampling.TaskTally(task_id=task_id, issued=sum(by_status.values()), started=started,
                              **{status: by_status.get(status, 0) for status in R.values})


def jobs_progress(jobs: list[RolloutJob]) -> dict[int, dict]:
    """The progress (as progress_from_tallies) of each of `jobs`, in one query: for lists of jobs, so they
    show the same counts as each job's page."""
    rows = (Rollout.objects.filter(job_id__in=[job.pk for job in jobs]).values_list("job_id", "task_id", "status")
            .annotate(n=Count("id"), started=Count("started_at")).order_by())
    counts: dict[int, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    started: dict[tuple[int, int], int] = defaultdict(int)
    for job_id, task_id, status, n, n_started in rows:
        counts[job_id][task_id][status] = n
        started[job_id, task_id] += count_started(status, n_started)
    return {job.pk: progress_from_tallies(job, [
        tally_from_counts(task_id, by_status, started=started[job.pk, task_id])
        for task_id, by_status in sorted(counts[job.pk].items())]) for job in jobs}


def budget_from_tallies(job: RolloutJob, tallies: list[sampling.TaskTally], task_keys: dict[int, str]) -> dict:
    """How the job's budget was spent: totals and one row per task. No queries."""
    policy = job_policy(job)
    total, created = policy.budget(len(tallies)), sum(t.issued for t in tallies)
    spent = sum(t.started for t in tallies)
    job_open = job.status in JOB_OPEN
    unplanned = max(0, total - created)
    rows = [{"task": task_keys.get(t.task_id, str(t.task_id)),
             **sampling.task_summary(t, policy, budget_left=unplanned, job_open=job_open)} for t in tallies]
    rows.sort(key=lambda row: row["task"])
    return {
        "policy": policy.name, "first_round": policy.first_round_size, "total": total,
        "spent": spent, "created": created, "queued": sum(t.queued for t in tallies),
        "unspent": max(0, total - spent),
        "may_still_spend": sampling.may_still_spend(tallies, policy) if job_open else 0,
        "per_task": rows,
    }


def job_budget(*, job: RolloutJob) -> dict:
    """The job's budget and how it was spent per task (two queries)."""
    tallies, _ = job_tallies(job_id=job.pk)
    keys = dict(Task.objects.filter(pk__in=[t.task_id for t in tallies]).values_list("pk", "key"))
    return budget_from_tallies(job, tallies, keys)


def progress_from_tallies(job: RolloutJob, tallies: list[sampling.TaskTally]) -> dict:
    """Counts for the progress bar. `total` includes budget an adaptive job may still spend. No queries."""
    by_status = {status: sum(getattr(t, status) for t in tallies) for status in R.values}
    issued = sum(t.issued for t in tallies)
    total = issued + (sampling.may_still_spend(tallies, job_policy(job)) if job.status in JOB_OPEN else 0)
    finished = sum(by_status[s] for s in Rollout.FINISHED)
    outcomes = by_status[R.SUCCEEDED] + by_status[R.FAILED]
    return {
        "total": total, "issued": issued, "finished": finished,
        "running": by_status[R.RUNNING], "queued": by_status[R.QUEUED], "concurrency": job.concurrency,
        "by_status": {status: n for status, n in by_status.items() if n},
        "percent": round(100 * finished / total) if total else 0,
        "success_rate": round(by_status[R.SUCCEEDED] / outcomes, 4) if outcomes else None,
    }


def job_progress(*, job: RolloutJob) -> dict:
    """Progress of a job (one query)."""
    tallies, _ = job_tallies(job_id=job.pk)
    return progress_from_tallies(job, tallies)


def job_get(*, job_id: int) -> RolloutJob:
    try:
        return RolloutJob.objects.select_related("task_set", "fleet", "endpoint").get(pk=job_id)
    except RolloutJob.DoesNotExist:
        raise NotFound(f"job {job_id} does not exist", field="job_id") from None


def job_detail(*, job_id: int) -> RolloutJob:
    """The job with `progress` and `budget` attached (three queries)."""
    job = job_get(job_id=job_id)
    tallies, _ = job_tallies(job_id=job.pk)
    keys = dict(Task.objects.filter(pk__in=[t.task_id for t in tallies]).values_list("pk", "key"))
    # Attached like annotations, for the API's JobDetailSerializer.
    job.progress = progress_from_tallies(job, tallies)  # type: ignore[attr-defined]
    job.budget = budget_from_tallies(job, tallies, keys)  # type: ignore[attr-defined]
    return job


def job_list() -> QuerySet[RolloutJob]:
    """Jobs with their rollout counts, newest first (one query per page)."""
    finished = list(Rollout.FINISHED)
    return (
        RolloutJob.objects.select_related("task_set", "fleet", "endpoint")
        .annotate(
            n_rollouts=Count("rollouts"),
            n_finished=Count("rollouts", filter=Q(rollouts__status__in=finished)),
            n_succeeded=Count("rollouts", filter=Q(rollouts__status=R.SUCCEEDED)),
            n_running=Count("rollouts", filter=Q(rollouts__status=R.RUNNING)),
        )
        .order_by("-id")
    )


def job_finished_rollouts(*, job_id: int, after: int, limit: int) -> list[Rollout]:
    """Finished rollouts of a job in finish order, strictly after the cursor `after` (a finish_seq). One query.

    finish_seq is handed out under the job's row lock, so it follows commit order: a row that is not
    visible yet will get a higher number than any row visible now, and polling never skips one.
    """
    return list(
        Rollout.objects.filter(job_id=job_id, finish_seq__gt=after)
        .select_related("task").only(
            "id", "job_id", "task__key", "sample_index", "status", "reward", "steps", "attempt", "error",
            "started_at", "finished_at", "finish_seq", "trajectory_id", "rerun_of_id",
        )
        .order_by("finish_seq")[:limit]
    )


def rollout_get(*, rollout_id: int) -> Rollout:
    try:
        return Rollout.objects.select_related("task").get(pk=rollout_id)
    except Rollout.DoesNotExist:
        raise NotFound(f"rollout {rollout_id} does not exist", field="rollout_id") from None


def taskset_list() -> QuerySet[TaskSet]:
    return TaskSet.objects.annotate(n_tasks=Count("tasks")).order_by("name")


def taskset_get_by_name(*, name: str, field: str = "task_set") -> TaskSet:
    try:
        return TaskSet.objects.get(name=name)
    except TaskSet.DoesNotExist:
        raise NotFound(f"{field}: no task set named {name!r}", field=field) from None
