"""HTML pages. Thin: a selector, a template."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import render

from experience.errors import NotFound
from experience.run_steps import run_labels, run_page_config
from experience.selectors import trajectory_get, trajectory_linked_runs, trajectory_list
from experience.services.curation import curation_history
from webapp.access.permissions import scope_required
from webapp.dashboard import charts, selectors
from webapp.dashboard.jobs import open_rollouts
from webapp.dashboard.live import job_snapshot
from webapp.dashboard.review import run_review_context
from webapp.rollouts import selectors as rollout_selectors
from webapp.rollouts.models import Rollout

HISTORY_ROWS = 20  # a run's latest curation events on its page; the API lists them all


@scope_required("jobs")
def overview(request):
    jobs = selectors.jobs_overview()
    return render(request, "dashboard/overview.html", {
        "fleets": selectors.fleets_overview(),
        "jobs": jobs,
        "trajectories": trajectory_list(limit=20),
        **outcome_charts(jobs),
    })


def outcome_charts(jobs) -> dict:
    """The overview's two outcome charts: the latest jobs' rollouts, and the most-run tasks' stored runs."""
    by_job = charts.outcome_bars(selectors.job_outcome_rows(jobs[:12]))
    by_task = charts.outcome_bars(selectors.task_outcome_rows())
    colours = charts.OUTCOME_COLOURS
    return {"job_bars": by_job, "job_chart_height": charts.chart_height(by_job),
            "job_legend": [(name, colours[name]) for name in ("succeeded", "failed", "infra_error", "cancelled", "open")],
            "task_bars": by_task, "task_chart_height": charts.chart_height(by_task),
            "task_legend": [(name, colours[name]) for name in ("succeeded", "failed", "unknown")]}


@scope_required("jobs")
def job_detail(request, job_id: int):
    try:
        job = rollout_selectors.job_get(job_id=job_id)
    except NotFound as error:
        raise Http404(str(error)) from None
    snapshot = job_snapshot(job=job)  # the live feed's figures, from one read of the job's rollouts
    return render(request, "dashboard/job.html", {
        "job": job, "progress": snapshot["progress"], "budget": snapshot["budget"], "grid": snapshot["grid"],
        "open_rollouts": open_rollouts(job=job),
    })


@scope_required("trajectories")
def trajectory_detail(request, trajectory_id: int):
    try:
        trajectory = trajectory_get(trajectory_id=trajectory_id)
    except NotFound as error:
        raise Http404(str(error)) from None
    rollout = Rollout.objects.filter(trajectory=trajectory).select_related("job").first()
    history = list(curation_history(trajectory_id=trajectory.pk)[: HISTORY_ROWS + 1])
    return render(request, "dashboard/trajectory.html", {
        "trajectory": trajectory, "rollout": rollout, "run": run_page_config(trajectory=trajectory),
        "labels": run_labels(trajectory=trajectory),
        "history": history[:HISTORY_ROWS], "history_more": len(history) > HISTORY_ROWS,
        "linked": trajectory_linked_runs(trajectory=trajectory),
        **run_review_context(trajectory=trajectory, user=request.user),
    })
