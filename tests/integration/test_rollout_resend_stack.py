"""Full stack: a rollout whose Celery message the broker lost (here: its queue purged) is sent again by the
reaper and runs once; a late duplicate of its message does nothing."""

from __future__ import annotations

import time

import pytest

from experience.models import Trajectory
from tests.redis_keys import forget_queue, unique_queue
from webapp.celery import app
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run
from workers.seed import seed_demo_endpoint
from workers.tasks.rollouts import broker_backlog, enqueue_rollout, reap_stale_rollouts

pytestmark = pytest.mark.django_db(transaction=True)
R = Rollout.Status


def _send_then_lose(demo_task_set, demo_fleet, demo_model_url, client) -> RolloutJob:
    """A one-rollout job whose message reaches the broker and is then lost with its queue."""
    lost_queue = unique_queue("lost")
    previous, app.conf.task_default_queue = app.conf.task_default_queue, lost_queue
    try:
        job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                         model_name="trove-demo-stand-in", task_keys=["slugify"], max_steps=15,
                         enqueue=enqueue_rollout)
        assert broker_backlog() == 1
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(lost_queue)
        assert broker_backlog() == 0
    finally:
        app.conf.task_default_queue = previous
        forget_queue(client, lost_queue)
    return job


def _wait_until_finished(job: RolloutJob, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.status == RolloutJob.Status.COMPLETED:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job.pk} did not finish: {list(job.rollouts.values_list('status', flat=True))}")


def test_a_rollout_whose_message_was_lost_is_sent_again_by_the_reaper_and_runs_once(
    request, settings, local_backend, proxy, demo_model_url, demo_task_set, demo_fleet, run_redis
):
    settings.TROVE_ROLLOUT_RESEND_S = 0
    job = _send_then_lose(demo_task_set, demo_fleet, demo_model_url, run_redis.client)
    request.getfixturevalue("celery_worker_process")  # a live worker: without a message it has nothing to run
    rollout = job.rollouts.get()
    assert Rollout.objects.get(pk=rollout.pk).status == R.QUEUED

    assert reap_stale_rollouts()["resent"] == 1  # what beat runs every 15 s
    _wait_until_finished(job)

    rollout.refresh_from_db()
    assert rollout.status in (R.SUCCEEDED, R.FAILED) and rollout.attempt == 1
    assert Trajectory.objects.filter(source="rollout").count() == 1
    # The message was not lost after all (a duplicate arrives late): it finds nothing to do.
    assert rollout_run(rollout_id=rollout.pk, worker="late-duplicate") is None
    assert reap_stale_rollouts()["resent"] == 0
    assert Trajectory.objects.filter(source="rollout").count() == 1


def test_nothing_is_sent_again_while_the_broker_queue_still_holds_messages(settings, demo_model_url, demo_task_set,
                                                                           demo_fleet, run_redis):
    settings.TROVE_ROLLOUT_RESEND_S = 0
    queue = unique_queue("waiting")
    previous, app.conf.task_default_queue = app.conf.task_default_queue, queue
    try:
        job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                         model_name="trove-demo-stand-in", task_keys=["slugify"], samples_per_task=2,
                         enqueue=enqueue_rollout)  # no worker on this queue: both messages wait their turn
        first_sent = sorted(job.rollouts.values_list("sent_at", flat=True))

        assert reap_stale_rollouts()["resent"] == 0
        assert broker_backlog() == 2
        assert sorted(job.rollouts.values_list("sent_at", flat=True)) == first_sent, "none marked as sent again"
    finally:
        app.conf.task_default_queue = previous
        forget_queue(run_redis.client, queue)
