"""The rollout runner in this process against real parts: bubblewrap sandboxes, the demo model, the proxy."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from experience.models import Step, Trajectory
from webapp.fleets.models import Sandbox
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create, rollout_start, taskset_upsert
from workers.rollout_runner import Attempt, Clock, _open_trajectory, rollout_run
from workers.seed import seed_demo_endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _job(task_set, fleet, model_url, **options):
    return job_create(task_set=task_set, fleet=fleet, endpoint=seed_demo_endpoint(model_url), model_name="trove-demo-stand-in",
                      enqueue=lambda rollout_id: None, **options)


def test_an_evaluation_that_hangs_is_cut_off_at_its_timeout_and_recorded(
    local_backend, proxy, demo_model_url, demo_fleet
):
    task_set = taskset_upsert(name="hanging", description="", source="api", tasks=[{
        "key": "hangs", "instruction": "Nothing to do: finish at once.", "eval_command": "sleep 600",
        "eval_timeout_s": 2, "files": {"README.md": "nothing here\n"},
    }])
    job = _job(task_set, demo_fleet, demo_model_url, max_steps=2)
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.FAILED and rollout.status == Rollout.Status.FAILED
    assert rollout.eval_timed_out is True and rollout.reward == 0.0
    eval_step = Step.objects.get(trajectory=rollout.trajectory, kind="eval")
    assert eval_step.is_error and eval_step.payload["timed_out"] is True
    assert "timed out" in eval_step.payload["text"]
    assert eval_step.duration_ms < 60_000
    assert not Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).exists()
    assert local_backend.list({}) == []


def test_a_rollout_runs_once_even_when_its_task_is_delivered_twice(local_backend, proxy, demo_model_url,
                                                                     demo_task_set, demo_fleet):
    job = _job(demo_task_set, demo_fleet, demo_model_url, task_keys=["slugify"], max_steps=15)
    rollout = job.rollouts.get()

    first = rollout_run(rollout_id=rollout.pk, worker="worker-a")
    second = rollout_run(rollout_id=rollout.pk, worker="worker-b")

    assert first in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)
    assert second is None
    assert Trajectory.objects.filter(source="rollout").count() == 1
    job.refresh_from_db()
    assert job.status == "completed"


def test_an_unknown_rollout_token_gets_401_from_the_proxy_and_nothing_is_recorded(proxy):
    before = Step.objects.count()
    request = urllib.request.Request(
        f"{proxy.base_url}/r/not-a-real-token/v1/chat/completions",
        data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401
    assert "error" in json.loads(caught.value.read())
    assert Step.objects.count() == before


def test_an_attempt_refuses_a_rollout_that_is_not_the_claimed_object_for_it_alone_holds_the_token(
    demo_model_url, demo_task_set, demo_fleet
):
    rollout = _job(demo_task_set, demo_fleet, demo_model_url, task_keys=["slugify"]).rollouts.get()
    claimed = rollout_start(rollout_id=rollout.pk, worker="test-worker", open_trajectory=_open_trajectory)
    refetched = Rollout.objects.get(pk=rollout.pk)  # the database keeps the token's hash only

    assert claimed is not None and Attempt(claimed, "test-worker", None, Clock()).proxy_token == claimed.proxy_token
    with pytest.raises(RuntimeError, match=f"rollout {rollout.pk} carries no proxy token"):
        Attempt(refetched, "test-worker", None, Clock())
