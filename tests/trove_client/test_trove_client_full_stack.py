"""A trainer on the full stack: the client submits over HTTP, a real Celery worker process runs the rollouts in
bubblewrap sandboxes against the demo model through the recording proxy, and the client streams the results."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from experience.models import Trajectory
from trove_client import TroveClient
from webapp.access.roles import role_groups_sync
from webapp.fleets.models import Sandbox
from workers.seed import seed_demo_endpoint

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_adaptive_job_submitted_by_the_client_runs_for_real_and_streams_back(
    celery_worker_process, live_server, demo_model_url, demo_task_set, demo_fleet
):
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["trainer"])
    trove = TroveClient(live_server.url, Token.objects.create(user=user).key)

    job = trove.submit_job(task_set=demo_task_set.name, fleet=demo_fleet.name, endpoint=seed_demo_endpoint(demo_model_url).name,
                           model_name="trove-demo-stand-in", samples_per_task=3, sampling="adaptive",
                           adaptive_first_round=2, task_keys=["calc_expr", "slugify"], max_steps=20, concurrency=2)
    rollouts = list(trove.iter_finished_rollouts(job["id"], poll_interval=0.5, timeout=240))

    status = trove.job_status(job["id"])
    assert status["status"] == "completed"
    assert 4 <= len(rollouts) <= 6, "the first round, then no more than the budget"
    assert status["budget"]["spent"] == len(rollouts)
    assert {r["status"] for r in rollouts} <= {"succeeded", "failed"}
    for rollout in rollouts:
        trajectory = Trajectory.objects.get(pk=rollout["trajectory_id"])
        assert trajectory.reward == rollout["reward"]
        assert rollout["trajectory_url"].endswith(f"/trajectories/{trajectory.pk}/")
    run = trove.get_trajectory(rollouts[0]["trajectory_id"])
    assert run["id"] == rollouts[0]["trajectory_id"] and run["reward"] == rollouts[0]["reward"]
    assert any(step["kind"] == "eval" for step in run["steps"])
    assert not Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).exists()
