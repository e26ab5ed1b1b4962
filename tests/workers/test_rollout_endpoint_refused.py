"""A whole rollout whose job's endpoint aims at loopback without allow_private_network: bubblewrap sandbox,
the runner, the real proxy. It ends as infra_error with the reason, at once (retrying cannot help), and the
target never sees a connection."""

from __future__ import annotations

import socket

import pytest

from webapp.rollouts.models import ModelEndpoint, Rollout
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rollout_aimed_at_loopback_fails_clearly_and_reaches_nothing(local_backend, proxy, demo_task_set,
                                                                      demo_fleet):
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(8)
    target.setblocking(False)
    try:
        # As a database edit (or a name that re-resolved to loopback) would leave it: registration refuses this.
        endpoint = ModelEndpoint.objects.create(name="aimed-at-loopback", model_names=["m"],
                                                base_url=f"http://127.0.0.1:{target.getsockname()[1]}/v1")
        job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=endpoint, task_keys=["slugify"],
                         max_steps=5, enqueue=lambda rollout_id: None)
        rollout = job.rollouts.get()

        status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

        rollout.refresh_from_db()
        assert status == rollout.status == Rollout.Status.INFRA_ERROR
        assert rollout.attempt == 1, "a refused endpoint is permanent: not retried"
        assert "aimed-at-loopback" in rollout.error and "loopback address" in rollout.error
        with pytest.raises(BlockingIOError):
            target.accept()
    finally:
        target.close()
