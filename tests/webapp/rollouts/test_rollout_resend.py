"""Rollouts whose Celery message was lost are sent again by the reaper; the start being a conditional claim,
a duplicate message does nothing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from experience.models import Trajectory
from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_open
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_cancel, rollout_requeue, rollout_start, rollouts_resend_due

pytestmark = pytest.mark.django_db
R = Rollout.Status


def _later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def test_queued_rollouts_sent_longer_ago_than_the_threshold_are_due_once_per_interval(settings):
    settings.TROVE_ROLLOUT_RESEND_S = 60
    job = make_job(["a", "b"])
    waiting, running = job.rollouts.order_by("id")
    rollout_start(rollout_id=running.pk, worker="w")

    assert rollouts_resend_due(now=_later(30)) == []  # sent 30 s ago: may just be waiting its turn
    assert rollouts_resend_due(now=_later(61)) == [waiting.pk]  # only the queued one
    assert rollouts_resend_due(now=_later(62)) == []  # just re-sent: not again before another interval
    assert rollouts_resend_due(now=_later(61 + 61)) == [waiting.pk]


def test_a_requeued_rollout_counts_from_its_requeue_and_a_cancelled_jobs_rollouts_are_never_due(settings):
    settings.TROVE_ROLLOUT_RESEND_S = 60
    job = make_job(["a"])
    rollout = job.rollouts.get()
    Rollout.objects.filter(pk=rollout.pk).update(created_at=timezone.now() - timedelta(hours=1))
    rollout_start(rollout_id=rollout.pk, worker="w")
    assert rollout_requeue(rollout_id=rollout.pk, worker="w", error="sandbox lost")

    assert rollouts_resend_due(now=_later(30)) == []
    job_cancel(job=job)
    assert rollouts_resend_due(now=_later(3600)) == []


def _open_for(rollout: Rollout) -> Trajectory:
    return trajectory_open(rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", task_key=rollout.task.key,
        source_ref=f"rollout:{rollout.pk}:attempt:{rollout.attempt}", status="running"))


def test_a_duplicate_start_is_a_no_op_and_leaves_no_trajectory_behind():
    job = make_job(["a"])
    rollout = job.rollouts.get()

    first = rollout_start(rollout_id=rollout.pk, worker="w1", open_trajectory=_open_for)
    second = rollout_start(rollout_id=rollout.pk, worker="w2", open_trajectory=_open_for)

    assert first is not None and second is None
    stored = Rollout.objects.get(pk=rollout.pk)
    assert (stored.status, stored.worker, stored.attempt) == (R.RUNNING, "w1", 1)
    assert stored.trajectory_id == first.trajectory.pk and stored.token == first.token
    assert list(Trajectory.objects.values_list("source_ref", flat=True)) == [f"rollout:{rollout.pk}:attempt:1"]
    job.refresh_from_db()
    assert job.status == "running"


def _claim_on_another_connection(rollout_id: int, worker: str) -> None:
    """Another worker's claim, committed. Made with the claim's conditional UPDATE alone, without the job's
    row lock (as a worker of an earlier release would, in a rolling upgrade): a start under way holds that
    lock, and rollout_start would wait for it."""
    def claim() -> None:
        try:
            assert Rollout.objects.filter(pk=rollout_id, status=R.QUEUED).update(status=R.RUNNING, worker=worker,
                                                                                  attempt=1)
        finally:
            connection.close()

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join()


@pytest.mark.django_db(transaction=True)
def test_a_start_that_loses_the_claim_after_reading_the_rollout_rolls_its_trajectory_back():
    job = make_job(["a"])
    rollout = job.rollouts.get()

    def open_then_lose_the_race(claimed: Rollout) -> Trajectory:
        trajectory = _open_for(claimed)
        # Another worker claims it between this start's read and its conditional claim.
        _claim_on_another_connection(rollout.pk, "faster")
        return trajectory

    assert rollout_start(rollout_id=rollout.pk, worker="slower", open_trajectory=open_then_lose_the_race) is None
    assert Rollout.objects.get(pk=rollout.pk).worker == "faster"
    assert not Trajectory.objects.exists()


def test_a_finished_rollout_is_never_due_and_its_late_duplicate_does_nothing(settings):
    settings.TROVE_ROLLOUT_RESEND_S = 0
    job = make_job(["a"])
    rollout = job.rollouts.get()
    finish(rollout.pk, R.SUCCEEDED)

    assert rollouts_resend_due(now=_later(3600)) == []
    assert rollout_start(rollout_id=rollout.pk, worker="late") is None
    assert Rollout.objects.get(pk=rollout.pk).status == R.SUCCEEDED


def test_a_start_that_finds_its_attempt_already_opened_by_another_worker_claims_nothing():
    job = make_job(["a"])
    rollout = job.rollouts.get()
    rollout.attempt = 1  # the attempt the start is about to open
    _open_for(rollout)  # another worker got there first (its claim not committed yet, in a real race)

    def open_exclusively(claimed: Rollout) -> Trajectory:
        return trajectory_open(exclusive=True, rollout_runner=True, record=TrajectoryRecord(
            source="rollout", source_format="trove-rollout", task_key=claimed.task.key,
            source_ref=f"rollout:{claimed.pk}:attempt:{claimed.attempt}", status="running"))

    assert rollout_start(rollout_id=rollout.pk, worker="second", open_trajectory=open_exclusively) is None
    stored = Rollout.objects.get(pk=rollout.pk)
    assert (stored.status, stored.worker, stored.attempt, stored.trajectory_id) == (R.QUEUED, "", 0, None)
