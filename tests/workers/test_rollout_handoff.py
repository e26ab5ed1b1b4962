"""The hand-off of a finishing rollout's slot (workers/tasks/rollouts.py Handoff), on the real Redis broker: a
task keeps the first rollout its finish sends only while nothing waits in a queue its worker consumes, never
while the worker shuts down or past its window; everything else goes to the broker."""

from __future__ import annotations

import time
import uuid

import pytest
from celery.worker import state as worker_state
from django.conf import settings

from webapp.celery import app
from webapp.proxy.wiring import redis_client
from workers.tasks import rollouts as rollout_tasks
from workers.tasks.rollouts import HANDOFF_WINDOW_S, Handoff, queues_backlog


@pytest.fixture
def queues():
    """Two fresh queues on the broker: the rollouts' (the app's default while the test runs) and another."""
    if not settings.REDIS_URL:
        pytest.fail("the hand-off tests need REDIS_URL (the broker)")
    rollouts, other = f"trove-test-handoff-{uuid.uuid4().hex[:8]}", f"trove-test-handoff-{uuid.uuid4().hex[:8]}"
    previous, app.conf.task_default_queue = app.conf.task_default_queue, rollouts
    yield rollouts, other
    app.conf.task_default_queue = previous
    redis_client(settings.REDIS_URL).delete(rollouts, other)


def test_the_first_rollout_sent_is_kept_and_the_rest_go_to_the_broker(queues):
    rollouts, other = queues
    handoff = Handoff([rollouts, other])
    for rollout_id in (11, 12, 13):
        handoff.enqueue(rollout_id)

    assert handoff.take() == 11
    assert handoff.take() is None
    assert queues_backlog([rollouts]) == 2


def test_a_message_waiting_in_any_consumed_queue_keeps_its_turn(queues):
    rollouts, other = queues
    app.send_task("trove.fleets.reconcile_all", queue=other)  # a periodic task, say, no worker takes here
    handoff = Handoff([rollouts, other])
    handoff.enqueue(21)

    assert handoff.take() is None
    assert queues_backlog([rollouts]) == 1  # 21 went through the broker, behind nothing of its own queue
    assert queues_backlog([rollouts, other]) == 2


def test_a_worker_shutting_down_keeps_nothing(queues, monkeypatch):
    rollouts, _ = queues
    monkeypatch.setattr(worker_state, "should_stop", 0)  # a warm shutdown's exit code (0) is set, not None
    handoff = Handoff([rollouts])
    handoff.enqueue(31)

    assert handoff.take() is None
    assert queues_backlog([rollouts]) == 1


def test_past_its_window_a_task_keeps_nothing(queues):
    rollouts, _ = queues
    handoff = Handoff([rollouts])
    handoff.started = time.monotonic() - HANDOFF_WINDOW_S
    handoff.enqueue(41)

    assert handoff.take() is None
    assert queues_backlog([rollouts]) == 1


def test_a_kept_rollout_left_unrun_is_sent_to_the_broker(queues, monkeypatch):
    rollouts, _ = queues

    def finish_then_fail(rollout_id, enqueue):
        enqueue(rollout_id + 1)  # the finish sent the next rollout, kept
        raise RuntimeError("the task failed after the finish's commit")

    monkeypatch.setattr(rollout_tasks, "run_one", finish_then_fail)
    with pytest.raises(RuntimeError):
        rollout_tasks.run_rollout.run(51)

    assert queues_backlog([rollouts]) == 1


def test_turned_off_it_keeps_nothing(queues, settings):
    rollouts, _ = queues
    settings.TROVE_ROLLOUT_HANDOFF = 0
    handoff = Handoff([rollouts])
    handoff.enqueue(61)

    assert handoff.take() is None
    assert queues_backlog([rollouts]) == 1
