"""A finishing rollout hands its slot to the job's next one in the same task, with no broker message between:
a real `celery worker` process of one slot runs a job of three rollouts, one at a time, from the one message
the job's creation sent, and every guarantee holds (one attempt each, the limit, every model call stored)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings as django_settings

from experience.models import Step
from tests.integration.test_job_concurrency import max_overlap
from tests.integration.test_rollout_failures import WorkerProcess, job_completed, shared_queue, wait_until
from webapp.proxy.wiring import ingest_pending_records
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create
from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint
from workers.tasks.rollouts import enqueue_rollout

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
__all__ = ["shared_queue"]  # a fixture, used by name below
RECEIVED = re.compile(r"Task trove\.rollouts\.run\[[0-9a-f-]+\] received")


def test_one_message_runs_a_whole_job_of_one_slot_one_rollout_after_another(
    proxy, local_backend, sandbox_root, demo_task_set, demo_fleet, demo_model_url, shared_queue, tmp_path
):
    worker = WorkerProcess(broker_url=django_settings.REDIS_URL, queue=shared_queue, log_path=tmp_path / "worker.log",
                           sandbox_root=sandbox_root, proxy_url=proxy.base_url, concurrency=1)
    try:
        job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                         model_name=DEMO_MODEL_NAME, samples_per_task=3, task_keys=["slugify"], max_steps=12,
                         concurrency=1, enqueue=enqueue_rollout)
        wait_until(lambda: job_completed(job), timeout=600, what="the job to complete", poll=0.3)
    finally:
        worker.stop()

    rollouts = list(job.rollouts.order_by("started_at"))
    assert {r.status for r in rollouts} <= {Rollout.Status.SUCCEEDED, Rollout.Status.FAILED}, [r.error for r in rollouts]
    assert [r.attempt for r in rollouts] == [1, 1, 1]
    assert max_overlap([(r.started_at, r.finished_at) for r in rollouts]) == 1
    received = len(RECEIVED.findall(worker.log_path.read_text()))
    assert received == 1, f"the worker took {received} messages for a job of 3 rollouts: the finishes did not hand off"
    ingest_pending_records(0.2)
    for rollout in rollouts:
        calls = Step.objects.filter(trajectory_id=rollout.trajectory_id, kind="model_call").count()
        assert calls == rollout.steps >= 1  # the builtin harness makes one model call per step
