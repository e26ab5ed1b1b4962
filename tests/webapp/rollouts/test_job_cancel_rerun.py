"""Cancel a job or one rollout, re-run a job's failed samples, and reaped rollouts, through the real services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from tests.webapp.rollouts.jobs_factories import Enqueued, drive, finish, make_job
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import (
    job_cancel,
    job_rerun_failed,
    rollout_cancel,
    rollout_finish,
    rollout_heartbeat,
    rollout_reap,
    rollout_start,
)

R = Rollout.Status
pytestmark = pytest.mark.django_db


def test_cancelling_a_job_ends_its_queued_and_running_rollouts_and_plans_nothing_more():
    job = make_job(["a", "b"], sampling="adaptive", samples_per_task=4, adaptive_first_round=2)
    done, running, *queued = job.rollouts.order_by("id")
    finish(done.pk, R.SUCCEEDED)
    rollout_start(rollout_id=running.pk, worker="w1")

    changed = job_cancel(job=job)

    assert changed == 3
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.CANCELLED and job.finished_at is not None
    statuses = dict(job.rollouts.values_list("pk", "status"))
    assert statuses == {done.pk: R.SUCCEEDED, running.pk: R.CANCELLED, **{r.pk: R.CANCELLED for r in queued}}
    assert rollout_heartbeat(rollout_id=running.pk, worker="w1") is False, "the worker is told to stop"
    assert rollout_finish(rollout_id=running.pk, worker="w1", status=R.FAILED) is False
    assert job.rollouts.count() == 4, "a cancelled job spends nothing more"
    assert sorted(job.rollouts.values_list("finish_seq", flat=True)) == [1, 2, 3, 4]


def test_cancelling_a_finished_job_changes_nothing():
    job = make_job(["a"])
    drive(job, lambda key, index: R.SUCCEEDED)

    assert job_cancel(job=job) == 0
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED


def test_cancelling_one_rollout_leaves_the_job_running_until_the_rest_finish():
    job = make_job(["a"], samples_per_task=2)
    first, second = job.rollouts.order_by("id")

    assert rollout_cancel(rollout=first) is True
    assert first.status == R.CANCELLED
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.QUEUED

    finish(second.pk, R.FAILED)
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
    assert rollout_cancel(rollout=second) is False, "a finished rollout cannot be cancelled"


def test_rerunning_failed_samples_adds_new_samples_to_the_same_job_and_reopens_it(django_capture_on_commit_callbacks):
    enqueued = Enqueued()
    job = make_job(["a", "b"], samples_per_task=2)
    drive(job, lambda key, index: {("a", 0): R.SUCCEEDED, ("a", 1): R.FAILED}.get((key, index), R.INFRA_ERROR))
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED

    with django_capture_on_commit_callbacks(execute=True):
        created = job_rerun_failed(job=job, enqueue=enqueued)

    assert [(r.task.key, r.sample_index, r.rerun_of.sample_index, r.status) for r in created] == [
        ("a", 2, 1, R.QUEUED), ("b", 2, 0, R.QUEUED), ("b", 3, 1, R.QUEUED)]
    assert enqueued.ids == [r.pk for r in created]
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.RUNNING and job.finished_at is None
    assert job.rollouts.filter(status__in=[R.FAILED, R.INFRA_ERROR]).count() == 3, "the old rows stay as they were"

    drive(job, lambda key, index: R.SUCCEEDED)
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
    assert job_rerun_failed(job=job) == [], "samples already re-run are not re-run twice"


def test_rerunning_only_infra_errors_leaves_the_models_failures_alone():
    job = make_job(["a"], samples_per_task=2)
    drive(job, lambda key, index: R.FAILED if index == 0 else R.INFRA_ERROR)

    created = job_rerun_failed(job=job, statuses=[R.INFRA_ERROR])

    assert [r.rerun_of.status for r in created] == [R.INFRA_ERROR]


def test_a_running_job_cannot_be_rerun_and_bad_statuses_are_named():
    job = make_job(["a"])

    with pytest.raises(Conflict) as conflict:
        job_rerun_failed(job=job)
    assert "still queued" in conflict.value.message
    with pytest.raises(ValidationError) as invalid:
        job_rerun_failed(job=job, statuses=["succeeded"])
    assert invalid.value.field == "statuses"


def test_a_reaped_rollout_out_of_attempts_finishes_as_infra_error_and_completes_the_job(settings):
    job = make_job(["a"])
    rollout = job.rollouts.get()
    rollout_start(rollout_id=rollout.pk, worker="dead-worker")
    stale = timezone.now() - timedelta(seconds=settings.TROVE_ROLLOUT_STALE_S + 5)
    Rollout.objects.filter(pk=rollout.pk).update(heartbeat_at=stale, attempt=settings.TROVE_ROLLOUT_MAX_ATTEMPTS)
    rollout.refresh_from_db()

    assert rollout_reap(rollout=rollout) == R.INFRA_ERROR

    rollout.refresh_from_db()
    job.refresh_from_db()
    assert rollout.status == R.INFRA_ERROR and rollout.finish_seq == 1
    assert job.status == RolloutJob.Status.COMPLETED


def test_job_options_are_checked_before_anything_is_written():
    with pytest.raises(ValidationError) as invalid:
        make_job(["a"], sampling="greedy")
    assert invalid.value.field == "sampling"
    with pytest.raises(ValidationError) as invalid:
        make_job(["a"], concurrency=0)
    assert invalid.value.field == "concurrency"
    assert not RolloutJob.objects.exists()
