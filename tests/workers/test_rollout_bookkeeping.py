"""A real rollout's record (runner in this process, bubblewrap sandbox, demo model, recording proxy): the
proxy's calls and the runner's steps, written by different writers and out of order, read back in time
order with contiguous numbers, and the counts and hash worked out ahead of the finish match a recount."""

from __future__ import annotations

import pytest

from experience.models import Trajectory
from experience.services.ingest import trajectory_finish
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run
from workers.seed import seed_demo_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _totals(trajectory: Trajectory) -> tuple:
    return (trajectory.status, trajectory.n_steps, trajectory.n_model_calls, trajectory.tokens_in,
            trajectory.tokens_out, trajectory.content_hash)


def test_a_rollouts_steps_are_in_time_order_and_its_counts_match_a_recount(local_backend, proxy, demo_model_url,
                                                                            demo_task_set, demo_fleet):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name="trove-demo-stand-in", enqueue=lambda rollout_id: None, task_keys=["slugify"],
                     max_steps=15)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="w")

    rollout.refresh_from_db()
    assert status == rollout.status and status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)
    trajectory = rollout.trajectory
    steps = list(trajectory.steps.order_by("seq").values_list("seq", "kind", "started_at"))
    assert [seq for seq, _, _ in steps] == list(range(len(steps))) and trajectory.next_seq == len(steps)
    starts = [started for _, _, started in steps]
    assert starts == sorted(starts)
    kinds = [kind for _, kind, _ in steps]
    assert kinds[0] == "sandbox_event" and kinds[-1] == "eval" and kinds.count("model_call") >= 1
    assert trajectory.n_steps == len(steps) and trajectory.n_model_calls == kinds.count("model_call")
    assert trajectory.status == "completed" and trajectory.reward == rollout.reward
    as_finished = _totals(trajectory)
    recounted = trajectory_finish(trajectory_id=trajectory.pk, status="completed", reward=rollout.reward,
                                  success=trajectory.success)
    assert _totals(recounted) == as_finished
