"""A job's concurrency is a hard limit on its running rollouts, held where a rollout starts, in the database.

Through the real services on the suite's database; the race test starts rollouts from many connections at
once. The same limit against real Celery worker processes: tests/integration/test_job_concurrency.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from experience.models import Trajectory
from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_open
from tests.webapp.rollouts.jobs_factories import Enqueued, drive, make_job, run_together
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import (
    jobs_dispatch_waiting,
    rollout_cancel,
    rollout_requeue,
    rollout_start,
    rollouts_resend_due,
)

pytestmark = pytest.mark.django_db
R = Rollout.Status


def _open_for(rollout: Rollout) -> Trajectory:
    return trajectory_open(rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", task_key=rollout.task.key,
        source_ref=f"rollout:{rollout.pk}:attempt:{rollout.attempt}", status="running"))


def _sent(enqueued: Enqueued) -> list[tuple[str, int]]:
    keys = dict(Rollout.objects.filter(pk__in=enqueued.ids).values_list("pk", "task__key"))
    index = dict(Rollout.objects.filter(pk__in=enqueued.ids).values_list("pk", "sample_index"))
    return [(keys[i], index[i]) for i in enqueued.ids]


def test_a_job_sends_only_as_many_rollouts_as_its_concurrency_and_each_finish_sends_the_next(
    django_capture_on_commit_callbacks,
):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b", "c"], samples_per_task=2, concurrency=2, enqueue=enqueued)
    assert _sent(enqueued) == [("a", 0), ("b", 0)], "two messages for a limit of two, first samples first"

    drive(job, lambda key, index: R.SUCCEEDED, enqueue=enqueued)

    assert _sent(enqueued) == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)], \
        "each finish sent the next waiting rollout, once"
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
    assert set(job.rollouts.values_list("attempt", flat=True)) == {1}


def test_a_start_when_the_job_is_full_is_deferred_without_an_attempt_and_runs_once_a_slot_frees(
    django_capture_on_commit_callbacks,
):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b"], concurrency=1, enqueue=enqueued)
    first, second = job.rollouts.order_by("id")
    assert enqueued.ids == [first.pk]
    assert rollout_start(rollout_id=first.pk, worker="w1", open_trajectory=_open_for) is not None

    # A message for the second one anyway (a duplicate, a re-send): the job is full.
    assert rollout_start(rollout_id=second.pk, worker="w2", open_trajectory=_open_for) is None

    second.refresh_from_db()
    assert (second.status, second.attempt, second.worker, second.started_at) == (R.QUEUED, 0, "", None)
    assert second.sent_at is None, "its message was dropped: it waits for a slot"
    assert second.trajectory_id is None
    assert not Trajectory.objects.filter(source_ref__startswith=f"rollout:{second.pk}:").exists()
    assert Rollout.objects.filter(job=job, status=R.RUNNING).count() == 1

    with django_capture_on_commit_callbacks(execute=True):
        assert finish_running(first.pk, "w1", enqueued)
    assert enqueued.ids == [first.pk, second.pk], "the finish that freed the slot sent it"
    started = rollout_start(rollout_id=second.pk, worker="w2", open_trajectory=_open_for)
    assert started is not None and started.attempt == 1
    first.refresh_from_db()
    assert started.started_at >= first.finished_at, "it started after the finish that freed its slot"


def finish_running(rollout_id: int, worker: str, enqueued: Enqueued) -> bool:
    from webapp.rollouts.services import rollout_finish

    return rollout_finish(rollout_id=rollout_id, worker=worker, status=R.SUCCEEDED, reward=1.0, enqueue=enqueued)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", [1, 2])
def test_starts_racing_from_many_connections_never_exceed_the_limit(limit):
    for _ in range(3):  # several rounds give the race its chances
        job = make_job([f"t{i}" for i in range(8)], concurrency=limit)
        ids = list(job.rollouts.values_list("pk", flat=True))
        started = _start_together(ids)

        assert len(started) == limit, started
        assert Rollout.objects.filter(job=job, status=R.RUNNING).count() == limit
        losers = Rollout.objects.filter(job=job, status=R.QUEUED)
        assert set(losers.values_list("attempt", flat=True)) == {0}, "a deferred start is no attempt"
        assert not losers.filter(sent_at__isnull=False).exists(), "every loser was deferred: it waits for a slot"


def _start_together(rollout_ids: list[int]) -> list[int]:
    started: list[int] = []

    def start(rollout_id: int) -> None:
        if rollout_start(rollout_id=rollout_id, worker=f"w{rollout_id}") is not None:
            started.append(rollout_id)

    run_together(rollout_ids, start)
    return started


def test_the_reaper_re_sends_only_rollouts_whose_message_went_out(settings):
    settings.TROVE_ROLLOUT_RESEND_S = 60
    job = make_job(["a", "b", "c"], concurrency=1)
    sent, *waiting = job.rollouts.order_by("id")
    later = timezone.now() + timedelta(seconds=61)

    assert rollouts_resend_due(now=later) == [sent.pk], "a waiting rollout has no message to lose"
    assert rollout_start(rollout_id=sent.pk, worker="w") is not None
    assert rollouts_resend_due(now=later + timedelta(seconds=61)) == []
    assert set(Rollout.objects.filter(pk__in=[w.pk for w in waiting]).values_list("status", flat=True)) == {R.QUEUED}


def test_a_requeued_rollout_keeps_its_slot_and_a_cancelled_one_gives_it_to_the_next(
    django_capture_on_commit_callbacks,
):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b"], concurrency=1, enqueue=enqueued)
    first, second = job.rollouts.order_by("id")
    rollout_start(rollout_id=first.pk, worker="w")
    assert rollout_requeue(rollout_id=first.pk, worker="w", error="sandbox lost")

    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_dispatch_waiting(enqueue=enqueued) == 0, "the requeued rollout's message holds the slot"
        assert rollout_cancel(rollout=first, enqueue=enqueued)
    assert enqueued.ids == [first.pk, second.pk]


def test_raising_a_jobs_concurrency_lets_the_reaper_send_what_now_fits(django_capture_on_commit_callbacks):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b", "c", "d"], concurrency=1, enqueue=enqueued)
    RolloutJob.objects.filter(pk=job.pk).update(concurrency=3)  # an admin's edit: no finish frees a slot

    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_dispatch_waiting(enqueue=enqueued) == 2
        assert jobs_dispatch_waiting(enqueue=enqueued) == 0, "sent once"
    assert len(enqueued.ids) == 3 == len(set(enqueued.ids))


def test_a_cancelled_job_sends_nothing_more(django_capture_on_commit_callbacks):
    from webapp.rollouts.services import job_cancel

    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b"], concurrency=1, enqueue=enqueued)
        job_cancel(job=job)
        assert jobs_dispatch_waiting(enqueue=enqueued) == 0

    assert len(enqueued.ids) == 1
    assert set(job.rollouts.values_list("status", flat=True)) == {R.CANCELLED}
