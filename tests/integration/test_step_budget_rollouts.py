"""A job's step budget ends an external harness's run at the proxy, whatever the harness: through the rollout
runner, in a proxy-only bubblewrap sandbox, against the demo model. The harness here takes no step limit the
job gives it (the example agent told to go on far longer; Codex, which has no turn flag at all): the proxy
refuses call max_steps + 1, the upstream never sees it, and the run is evaluated with the reason step_budget."""

from __future__ import annotations

import pytest

from experience.models import Trajectory
from tests.integration.test_harness_presets import (  # noqa: F401 (fixtures)
    bundle_backend,
    demo_model,
    harness_fleet,
    preset_job,
    require_bundle,
)
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run

MODEL = "trove-demo-stand-in"
# The example agent with a step limit of its own far above the job's.
UNBOUNDED_AGENT = "python3 /opt/trove/harness/mini_agent.py --max-steps 40"


def assert_ended_by_the_budget(rollout: Rollout, max_steps: int, served: int) -> None:
    trajectory = rollout.trajectory
    assert trajectory.status == Trajectory.Status.COMPLETED
    calls = trajectory.steps.filter(kind="model_call")
    assert calls.count() == served == max_steps == rollout.steps, "the refused call reached neither model nor store"
    assert not calls.filter(is_error=True).exists()
    harness = trajectory.steps.get(kind="command", payload__reason="step_budget")
    assert harness.payload["model_calls"] == max_steps
    end = trajectory.steps.get(kind="note", payload__reason="step_budget")
    assert end.payload["refused_calls"] >= 1
    assert f"the job's step budget of {max_steps} model calls was spent" in end.preview
    assert trajectory.steps.filter(kind="eval").exists(), "a run the budget ended is the agent's: evaluated"


@pytest.mark.django_db(transaction=True)
def test_an_external_harness_with_no_step_limit_is_stopped_at_the_jobs_budget_by_the_proxy(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet
):
    job = job_create(task_set=demo_task_set, fleet=proxy_only_fleet, model_name=MODEL,
                     endpoint=make_endpoint(model_upstream.url, model_names=[MODEL]), enqueue=lambda rollout_id: None,
                     harness="external", harness_command=UNBOUNDED_AGENT, max_steps=2, task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED), rollout.error
    assert_ended_by_the_budget(rollout, 2, model_upstream.requests)
    harness = rollout.trajectory.steps.get(kind="command", payload__reason="step_budget")
    assert "step budget of 2 model calls is spent" in harness.payload["output"], "the agent was told why"


@pytest.mark.django_db(transaction=True)
def test_codex_which_takes_no_turn_limit_is_stopped_at_the_jobs_budget_and_evaluated(
    bundle_backend, unix_proxy, demo_model, demo_task_set, harness_fleet  # noqa: F811
):
    require_bundle("codex")
    job = preset_job(demo_task_set, harness_fleet, demo_model, "codex", max_steps=2)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED), rollout.error
    assert_ended_by_the_budget(rollout, 2, demo_model.served)
