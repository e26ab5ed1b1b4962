"""The thin pipeline end to end on the full stack: a real Celery worker process on Redis, Postgres,
bubblewrap sandboxes, the demo model, and the recording proxy."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from experience.models import Step, Trajectory
from webapp.fleets.models import Sandbox
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import job_create
from workers.sandboxes.local import LocalBackend
from workers.seed import seed_demo_endpoint
from workers.tasks.rollouts import enqueue_rollout

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TASKS = ["calc_expr", "roman_numerals", "slugify"]


def wait_for_job(job: RolloutJob, timeout: float = 240) -> RolloutJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.status == RolloutJob.Status.COMPLETED:
            return job
        time.sleep(0.5)
    statuses = list(job.rollouts.values_list("status", "error"))
    raise AssertionError(f"job {job.pk} did not complete in {timeout}s: {statuses}")


def test_a_small_job_completes_with_recorded_trajectories_and_leaves_no_sandbox(
    celery_worker_process, demo_model_url, demo_task_set, demo_fleet, sandbox_root, admin_client
):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name="trove-demo-stand-in", samples_per_task=2, task_keys=TASKS, max_steps=20,
                     enqueue=enqueue_rollout)
    wait_for_job(job)

    rollouts = list(job.rollouts.select_related("trajectory"))
    assert len(rollouts) == 6
    assert {r.status for r in rollouts} <= {Rollout.Status.SUCCEEDED, Rollout.Status.FAILED}
    for rollout in rollouts:
        trajectory = rollout.trajectory
        assert trajectory.status == Trajectory.Status.COMPLETED
        assert trajectory.reward == (1.0 if rollout.status == Rollout.Status.SUCCEEDED else 0.0)
        kinds = list(trajectory.steps.order_by("seq").values_list("kind", flat=True))
        assert kinds.count("model_call") >= 2 and kinds.count("command") >= 1 and kinds[-1] == "eval"
        assert trajectory.n_model_calls == kinds.count("model_call")
        first_call = trajectory.steps.filter(kind="model_call").order_by("seq").first()
        assert first_call.blob_refs["request_messages"], "the context the model saw is stored as blobs"
        assert first_call.tokens_in and first_call.payload["latency_ms"] > 0
        starts = list(trajectory.steps.exclude(started_at=None).order_by("seq").values_list("started_at", flat=True))
        assert starts == sorted(starts), "step numbers follow time"

    # the pages render them
    overview = admin_client.get("/").content.decode()
    assert f"/jobs/{job.pk}/" in overview
    job_page = admin_client.get(f"/jobs/{job.pk}/").content.decode()
    assert all(key in job_page for key in TASKS) and "6/6 finished" in job_page
    trajectory = rollouts[0].trajectory
    command = Step.objects.filter(trajectory=trajectory, kind="command").first()
    replay = admin_client.get(f"/trajectories/{trajectory.pk}/").content.decode()
    # The run page fetches its steps from the steps API (only the first screen is embedded): the command is there.
    views = admin_client.get(f"/api/v1/trajectories/{trajectory.pk}/steps/view/?seqs={command.seq}")
    assert views.status_code == 200
    shown = json.dumps(json.loads(gzip.decompress(views.content) if views.get("Content-Encoding") == "gzip"
                                  else views.content), ensure_ascii=False)
    assert json.dumps(command.payload["command"].split("\n")[0][:40], ensure_ascii=False)[1:-1] in shown
    assert "model_call" in replay and f"Reward</span> <strong id=\"reward\">{trajectory.reward}" in replay

    # and no sandbox is left behind
    assert not Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).exists()
    assert LocalBackend(root=sandbox_root).list({}) == []
    assert [p.name for p in sandbox_root.iterdir() if not p.name.startswith(".")] == []
