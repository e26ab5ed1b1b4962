"""What the dashboard pages read. Each selector does a fixed number of queries, whatever the data size."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Q

from webapp.fleets.models import Fleet, Sandbox
from webapp.rollouts import selectors as rollout_selectors
from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout, RolloutJob


def fleets_overview() -> list[dict]:
    fleets = list(Fleet.objects.select_related("template").order_by("name"))
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    rows = Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).values_list("fleet_id", "state").annotate(n=Count("id"))
    for fleet_id, state, n in rows:
        counts[fleet_id][state] = n
    return [{"fleet": fleet, "states": counts[fleet.pk]} for fleet in fleets]


def jobs_overview(*, limit: int = 20) -> list[RolloutJob]:
    """The latest jobs, each with `progress` attached: the counts its page and the API show (two queries)."""
    jobs = list(RolloutJob.objects.select_related("task_set", "fleet").order_by("-id")[:limit])
    progress = rollout_selectors.jobs_progress(jobs)
    for job in jobs:
        job.progress = progress[job.pk]  # type: ignore[attr-defined]
    return jobs


def jobs_page(*, status: str = "", task_set: str = "", fleet: str = "", q: str = "", before: int | None = None,
              limit: int = 50) -> tuple[list[RolloutJob], int | None]:
    """A page of jobs, newest first, filtered, each with `progress` attached (two queries), and the cursor of
    the next page (None on the last)."""
    jobs = RolloutJob.objects.select_related("task_set", "fleet", "endpoint").order_by("-id")
    if status:
        jobs = jobs.filter(status=status)
    if task_set:
        jobs = jobs.filter(task_set__name=task_set)
    if fleet:
        jobs = jobs.filter(fleet__name=fleet)
    if q:
        jobs = jobs.filter(Q(name__icontains=q) | Q(pk=int(q)) if q.isdigit() else Q(name__icontains=q))
    if before is not None:
        jobs = jobs.filter(pk__lt=before)
    page = list(jobs[: limit + 1])
    more, page = len(page) > limit, page[:limit]
    progress = rollout_selectors.jobs_progress(page)
    for job in page:
        job.progress = progress[job.pk]  # type: ignore[attr-defined]
    return page, (page[-1].pk if more else None)


def job_rerunnable_counts(*, job: RolloutJob) -> dict[str, int]:
    """How many of the job's samples a re-run would run again, by status (one query)."""
    rows = (Rollout.objects.filter(job_id=job.pk, status__in=rollout_services.RERUNNABLE, reruns__isnull=True)
            .values_list("status").annotate(n=Count("id")).order_by("status"))
    return {status: n for status, n in rows}


def job_outcome_rows(jobs: list[RolloutJob]) -> list[tuple[str, str, dict[str, int]]]:
    """The overview chart's rows by job, from the progress jobs_overview attached (no queries)."""
    from django.urls import reverse

    rows = []
    for job in jobs:
        by_status = dict(job.progress["by_status"])  # type: ignore[attr-defined]
        by_status["open"] = by_status.pop("queued", 0) + by_status.pop("running", 0)
        rows.append((str(job), reverse("dashboard:job", args=[job.pk]), by_status))
    return rows


def task_outcome_rows(*, limit: int = 12) -> list[tuple[str, str, dict[str, int]]]:
    """The overview chart's rows by task: the tasks with the most stored runs, each run's outcome (one query)."""
    from urllib.parse import urlencode

    from django.urls import reverse

    from experience.models import Trajectory

    rows = (Trajectory.objects.values("task_key")
            .annotate(n=Count("id"), succeeded=Count("id", filter=Q(success=True)),
                      failed=Count("id", filter=Q(success=False)), unknown=Count("id", filter=Q(success__isnull=True)))
            .order_by("-n", "task_key")[:limit])
    return [(row["task_key"] or "(no task)", f"{reverse('dashboard:explorer')}?{urlencode({'task': row['task_key']})}",
             {"succeeded": row["succeeded"], "failed": row["failed"], "unknown": row["unknown"]}) for row in rows]
