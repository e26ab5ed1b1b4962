"""Shared helpers for the jobs tests: a fleet, a task set, jobs, and a deterministic stand-in for outcomes.

Outcomes are decided by the test (a function of task key and sample index) and applied through the real
services (rollout_start, rollout_finish), so the state machine, the locks and the planner all run for real.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable

import pytest
import redis
from django.conf import settings
from django.test import TestCase

from tests.redis_keys import forget_queue, unique_queue
from webapp.fleets import services as fleet_services
from webapp.fleets.models import Fleet
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, TaskSet
from webapp.rollouts.services import job_create, rollout_finish, rollout_start, taskset_upsert

R = Rollout.Status
Outcome = Callable[[str, int], str]


class Enqueued:
    """An `enqueue` callable that remembers the rollout ids it was given (the real one sends a Celery task)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, rollout_id: int) -> None:
        with self._lock:
            self.ids.append(rollout_id)


def make_fleet(name: str | None = None) -> Fleet:
    template = fleet_services.template_create(name=f"tpl-{uuid.uuid4().hex[:6]}")
    return fleet_services.fleet_create(name=name or f"fleet-{uuid.uuid4().hex[:6]}", template=template)


def make_task_set(keys: list[str], name: str | None = None) -> TaskSet:
    tasks = [{"key": key, "instruction": f"solve {key}", "eval_command": "true"} for key in keys]
    return taskset_upsert(name=name or f"set-{uuid.uuid4().hex[:6]}", description="", source="api", tasks=tasks)


def make_endpoint(base_url: str = "http://127.0.0.1:9/v1", *, name: str | None = None,
                  model_names: list[str] | None = None, **fields) -> ModelEndpoint:
    """A registered model endpoint, through the real registration (loopback allowed unless told otherwise)."""
    from webapp.rollouts.endpoints import endpoint_register

    fields.setdefault("allow_private_network", True)
    return endpoint_register(name=name or f"ep-{uuid.uuid4().hex[:8]}", base_url=base_url,
                             protocol=fields.pop("protocol", "chat"), model_names=model_names or ["stand-in"],
                             **fields)


def make_job(keys: list[str], *, enqueue: Enqueued | None = None, **options) -> RolloutJob:
    if "endpoint" not in options:
        options["endpoint"] = make_endpoint(model_names=[options.get("model_name") or "stand-in"])
    return job_create(task_set=make_task_set(keys), fleet=make_fleet(), enqueue=enqueue or Enqueued(), **options)


def finish(rollout_id: int, status: str, *, enqueue: Enqueued | None = None, worker: str = "test-worker") -> bool:
    """Run one rollout through the real state machine: claim it, then end it with `status`."""
    assert rollout_start(rollout_id=rollout_id, worker=worker) is not None
    return rollout_finish(rollout_id=rollout_id, worker=worker, status=status, enqueue=enqueue or Enqueued(),
                          reward=1.0 if status == R.SUCCEEDED else 0.0)


def drive(job: RolloutJob, outcome: Outcome, *, enqueue: Enqueued | None = None, limit: int = 10_000) -> list[int]:
    """Finish the job's queued rollouts one at a time until none is left. Returns the order.

    Like a worker when `enqueue` has received the job's first messages (the job was made under
    django_capture_on_commit_callbacks(execute=True)): the rollouts sent, in the order they were sent, and
    only those, so a rollout no one sent is left queued where the caller's assertions see it. Otherwise the
    oldest queued rollout each time. What each finish sends is sent at once (its after-commit callbacks run)."""
    order: list[int] = []
    while len(order) < limit:
        rollout_id = _next_to_run(job, enqueue, order)
        if rollout_id is None:
            return order
        rollout = Rollout.objects.select_related("task").get(pk=rollout_id)
        with TestCase.captureOnCommitCallbacks(execute=True):  # what the finish sends, sent now
            finish(rollout.pk, outcome(rollout.task.key, rollout.sample_index), enqueue=enqueue)
        order.append(rollout.pk)
    raise AssertionError("the job kept planning rollouts past the limit")


def _next_to_run(job: RolloutJob, enqueue: Enqueued | None, done: list[int]) -> int | None:
    if enqueue is not None and enqueue.ids:
        return next((rollout_id for rollout_id in enqueue.ids if rollout_id not in done), None)
    return job.rollouts.filter(status=R.QUEUED).order_by("id").values_list("pk", flat=True).first()


def samples_per_task(job: RolloutJob) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in job.rollouts.values_list("task__key", flat=True):
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.fixture
def celery_queue():
    """Route this test's Celery messages to a queue of its own on the real Redis; read back their headers."""
    from webapp.celery import app

    if not settings.REDIS_URL:
        pytest.fail("these tests read the enqueued rollouts from Redis: run them with REDIS_URL set")
    queue, previous = unique_queue("jobs"), app.conf.task_default_queue
    app.conf.task_default_queue = queue
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield lambda: [json.loads(m)["headers"] for m in client.lrange(queue, 0, -1)]
    forget_queue(client, queue)
    client.close()
    app.conf.task_default_queue = previous


def run_together(ids: list[int], action: Callable[[int], object], *, timeout: float = 30) -> None:
    """Call `action(id)` for every id at once, each in its own thread (so on its own database connection),
    released together by a barrier; an error in any thread is raised here, in the test's."""
    from django.db import connection

    barrier = threading.Barrier(len(ids))
    errors: list[BaseException] = []

    def run(one: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            action(one)
        except BaseException as error:  # surfaced below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(one,)) for one in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2 * timeout)
    assert not errors, errors
