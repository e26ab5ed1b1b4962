"""What the dashboard pages read. Each selector does a fixed number of queries, whatever the data size."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count

from webapp.fleets.models import Fleet, Sandbox
from webapp.rollouts import selectors as rollout_selectors
from webapp.rollouts.models import RolloutJob


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
