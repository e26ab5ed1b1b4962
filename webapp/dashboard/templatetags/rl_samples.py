"""RL samples on the run and job pages: `{% run_samples_panel trajectory %}`, `{% job_samples_line job %}`.

Tags rather than view context so each page includes them with one line. The job line assembles at most
JOB_RUNS of the job's latest finished training rollouts (reading their model calls' payloads), and says so;
the run panel a run of at most RUN_CALLS model calls (a longer one is left to the samples API).
"""

from __future__ import annotations

from typing import Any

from django import template

from experience.distill.errors import TokenizerUnavailable
from experience.models import Step
from experience.services.rl_samples import assembly_summary, run_samples, samples_overview
from webapp.rollouts.models import Rollout

register = template.Library()
JOB_RUNS = 20  # the job page is polled while a job runs: a bounded sample of its latest rollouts
RUN_CALLS = 100  # a longer run is assembled through the samples API, not on each page load (the run page must stay fast)
TRAINING = (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)


@register.inclusion_tag("dashboard/rl_samples_run.html")
def run_samples_panel(trajectory: Any) -> dict[str, Any]:
    # At most RUN_CALLS + 1 rows read, unsorted (any of them will do), so the page costs the same whatever
    # the run's length.
    model_calls = Step.objects.filter(trajectory_id=trajectory.pk, kind=Step.Kind.MODEL_CALL).order_by()
    calls = len(model_calls.values_list("id", flat=True)[: RUN_CALLS + 1])
    if calls > RUN_CALLS:
        calls = max(calls, trajectory.n_model_calls)
        return {"summary": {"calls": calls, "samples": 0, "note": f"more than {RUN_CALLS} model calls are not assembled on this page (the samples API or an rl dataset does)"},
                "samples": []}
    try:
        assembly = run_samples(trajectory_ids=[trajectory.pk])[trajectory.pk]
    except TokenizerUnavailable as error:  # an operator's setting: the panel says so, the run page still shows
        return {"summary": {"calls": calls, "samples": 0, "note": error.message}, "samples": []}
    return {"summary": assembly_summary(assembly), "samples": assembly.samples}


@register.inclusion_tag("dashboard/rl_samples_job.html")
def job_samples_line(job: Any) -> dict[str, Any]:
    ids = list(
        Rollout.objects.filter(job_id=job.pk, status__in=TRAINING, trajectory__isnull=False)
        .order_by("-finish_seq").values_list("trajectory_id", flat=True)[:JOB_RUNS]
    )
    try:
        overview = samples_overview(run_samples(trajectory_ids=ids).values()) if ids else None
    except TokenizerUnavailable as error:
        return {"overview": None, "capped": False, "error": error.message}
    return {"overview": overview, "capped": len(ids) == JOB_RUNS}
