"""The job page's live feed: one JSON snapshot of a job, polled by webapp/static/trove/job.js every 2 s. The
page itself is rendered from the same snapshot (job_snapshot), so it opens with the figures the feed gives.

Three queries whatever the job's size (the job, its rollouts as tuples, its tasks' keys). A DRF view, so the
page's session and a program's token both work, and a missing job is a JSON 404, not a login redirect.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.rollouts import selectors
from webapp.rollouts.models import Rollout, RolloutJob, Task

RATE_WINDOW = timedelta(minutes=5)  # throughput is measured over the last few minutes, so ETA follows changes


def job_live(*, job_id: int, now: datetime | None = None) -> dict:
    """Progress, the tasks x samples grid, success rate, throughput, ETA and the per-task budget of a job."""
    return job_snapshot(job=selectors.job_get(job_id=job_id), now=now)


def job_snapshot(*, job: RolloutJob, now: datetime | None = None) -> dict:
    """job_live for a job already read. Every figure comes from one read of its rollouts, so the page
    rendered from it and the feed polled after it count the same way, and never disagree with each other."""
    now = now or timezone.now()
    rows = list(Rollout.objects.filter(job_id=job.pk).order_by("task_id", "sample_index")
                .values_list("task_id", "sample_index", "status", "trajectory_id", "finished_at", "started_at"))
    tasks = {pk: (key, difficulty) for pk, key, difficulty in
             Task.objects.filter(pk__in={row[0] for row in rows}).values_list("pk", "key", "difficulty")}
    tallies = _tallies(rows)
    progress = selectors.progress_from_tallies(job, tallies)
    budget = selectors.budget_from_tallies(job, tallies, {pk: key for pk, (key, _) in tasks.items()})
    rate = _throughput_per_min(job, [row[4] for row in rows if row[4]], now)
    remaining = progress["total"] - progress["finished"]
    return {
        "job": {"id": job.pk, "status": job.status, "sampling": job.sampling, "concurrency": job.concurrency,
                "open": job.status in selectors.JOB_OPEN},
        "progress": progress,
        "throughput_per_min": None if rate is None else round(rate, 2),
        "eta_s": round(60 * remaining / rate) if rate and remaining and job.status in selectors.JOB_OPEN else None,
        "grid": _grid(rows, tasks),
        "budget": budget,
        "trajectory_url": reverse("dashboard:trajectory", args=[0]).replace("/0/", "/{id}/"),
    }


def _tallies(rows: list[tuple]) -> list:
    """The job's tallies from its rows, counted as selectors.job_tallies counts them (the API's figures)."""
    counts: dict[int, Counter] = defaultdict(Counter)
    started: Counter = Counter()
    for task_id, _, status, _, _, started_at in rows:
        counts[task_id][status] += 1
        started[task_id] += selectors.count_started(status, int(started_at is not None))
    return [selectors.tally_from_counts(task_id, dict(by_status), started=started[task_id])
            for task_id, by_status in sorted(counts.items())]


def _throughput_per_min(job: RolloutJob, finished_at: list[datetime], now: datetime) -> float | None:
    """Rollouts finished per minute: over the last few minutes while the job runs, over its whole run after."""
    started = job.started_at or job.created_at
    if job.status not in selectors.JOB_OPEN:
        span = ((job.finished_at or now) - started).total_seconds()
        return len(finished_at) * 60 / span if span > 0 and finished_at else None
    window_start = max(started, now - RATE_WINDOW)
    span = (now - window_start).total_seconds()
    recent = sum(1 for at in finished_at if at >= window_start)
    return recent * 60 / span if span > 0 else None


def _grid(rows: list[tuple], tasks: dict[int, tuple[str, str]]) -> list[dict]:
    grid: dict[int, dict] = {}
    for task_id, sample_index, status, trajectory_id, *_ in rows:
        key, difficulty = tasks.get(task_id, (str(task_id), ""))
        row = grid.setdefault(task_id, {"task": key, "difficulty": difficulty, "cells": [], "succeeded": 0,
                                        "finished": 0})
        row["cells"].append([sample_index, status, trajectory_id])
        row["succeeded"] += status == Rollout.Status.SUCCEEDED
        row["finished"] += status in Rollout.FINISHED
    return sorted(grid.values(), key=lambda row: row["task"])


class JobLiveApi(APIView):
    scope_area = "jobs"
    @extend_schema(responses=OpenApiTypes.OBJECT, operation_id="jobs_live")
    def get(self, request: Request, job_id: int) -> Response:
        """A snapshot of the job for its dashboard page (polled every 2 s)."""
        return Response(job_live(job_id=job_id))
