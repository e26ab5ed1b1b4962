"""Jobs spend their budget through the real services: outcomes are chosen by the test, nothing is mocked."""

from __future__ import annotations

import pytest

from tests.webapp.rollouts.jobs_factories import (
    Enqueued,
    drive,
    finish,
    make_job,
    run_together,
    samples_per_task,
)
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.selectors import job_budget, job_progress
from webapp.rollouts.services import job_plan_next, rollout_start

R = Rollout.Status


def always_pass_always_fail_or_alternate(key: str, index: int) -> str:
    if key == "easy":
        return R.SUCCEEDED
    if key == "hard":
        return R.FAILED
    return R.SUCCEEDED if index % 2 == 0 else R.FAILED


@pytest.mark.django_db
def test_an_adaptive_job_spends_its_whole_budget_on_the_mixed_tasks_and_no_more(django_capture_on_commit_callbacks):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["easy", "hard", "mixed-a", "mixed-b"], sampling="adaptive", samples_per_task=4,
                       adaptive_first_round=2, concurrency=2, enqueue=enqueued)
    assert len(enqueued.ids) == 2, "no more sent than the job's concurrency"
    drive(job, always_pass_always_fail_or_alternate, enqueue=enqueued)

    counts = samples_per_task(job)
    assert sum(counts.values()) == 4 * 4, "the budget is samples_per_task x tasks, all of it spent"
    assert counts["easy"] == 2 and counts["hard"] == 2, "only the first round for always-pass / always-fail"
    assert counts["mixed-a"] + counts["mixed-b"] == 12
    assert min(counts["mixed-a"], counts["mixed-b"]) >= 4, "both mixed tasks get a share"
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED and job.finished_at is not None
    assert sorted(enqueued.ids) == sorted(job.rollouts.values_list("pk", flat=True)), "every rollout was enqueued"


@pytest.mark.django_db
def test_the_budget_summary_says_how_each_task_spent_its_samples():
    job = make_job(["easy", "hard", "mixed"], sampling="adaptive", samples_per_task=4, adaptive_first_round=2,
                   concurrency=1)
    drive(job, always_pass_always_fail_or_alternate)
    job.refresh_from_db()

    budget = job_budget(job=job)

    rows = {row["task"]: row for row in budget["per_task"]}
    assert (budget["total"], budget["spent"], budget["unspent"], budget["may_still_spend"]) == (12, 12, 0, 0)
    assert {k: v for k, v in rows["easy"].items() if k != "task_id"} == {
        "task": "easy", "spent": 2, "issued": 2, "queued": 0, "running": 0, "open": 0, "succeeded": 2,
        "failed": 0, "infra_error": 0, "cancelled": 0, "pass_rate": 1.0, "stopped": True,
        "stopped_because": "always passed"}
    assert rows["hard"]["stopped_because"] == "always failed" and rows["hard"]["pass_rate"] == 0.0
    assert rows["mixed"]["spent"] == 8 and rows["mixed"]["pass_rate"] == 0.5
    assert rows["mixed"]["stopped_because"] == "job budget spent"


@pytest.mark.django_db
def test_an_adaptive_job_whose_tasks_never_mix_ends_after_the_first_round_with_budget_left():
    job = make_job(["easy", "hard"], sampling="adaptive", samples_per_task=8, adaptive_first_round=3)

    drive(job, always_pass_always_fail_or_alternate)

    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
    assert samples_per_task(job) == {"easy": 3, "hard": 3}
    budget = job_budget(job=job)
    assert (budget["spent"], budget["unspent"], budget["may_still_spend"]) == (6, 10, 0)
    progress = job_progress(job=job)
    assert (progress["finished"], progress["total"], progress["percent"]) == (6, 6, 100)
    assert progress["success_rate"] == 0.5


@pytest.mark.django_db
def test_an_adaptive_job_creates_only_its_first_round_and_counts_the_rest_as_budget_it_may_spend():
    job = make_job(["a", "b", "c"], sampling="adaptive", samples_per_task=5, adaptive_first_round=2)

    assert job.rollouts.count() == 6
    assert sorted(job.rollouts.values_list("sample_index", flat=True)) == [0, 0, 0, 1, 1, 1]
    progress = job_progress(job=job)
    assert (progress["issued"], progress["total"]) == (6, 15)


@pytest.mark.django_db
def test_a_uniform_job_issues_every_sample_at_once_and_completes_when_they_have_finished(
    django_capture_on_commit_callbacks,
):
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(["a", "b"], samples_per_task=3, enqueue=enqueued)
    assert job.rollouts.count() == 6
    sent_first = list(Rollout.objects.filter(pk__in=enqueued.ids).values_list("task__key", "sample_index"))
    assert sorted(sent_first) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)], \
        "as many sent as the job's concurrency (4), every task's first samples first"

    drive(job, always_pass_always_fail_or_alternate, enqueue=enqueued)

    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
    assert job.rollouts.count() == 6
    assert sorted(enqueued.ids) == sorted(job.rollouts.values_list("pk", flat=True)), "each sent once, as slots freed"
    assert {row["stopped_because"] for row in job_budget(job=job)["per_task"]} == {"all its samples issued"}


@pytest.mark.django_db
def test_planning_again_is_harmless():
    enqueued = Enqueued()
    job = make_job(["m"], sampling="adaptive", samples_per_task=4, adaptive_first_round=2, concurrency=1,
                   enqueue=enqueued)
    first, second = job.rollouts.order_by("id")
    finish(first.pk, R.SUCCEEDED, enqueue=enqueued)
    finish(second.pk, R.FAILED, enqueue=enqueued)
    assert job.rollouts.count() == 3  # one more: the task is mixed, and concurrency is 1

    assert job_plan_next(job=job, enqueue=enqueued) == []
    assert job_plan_next(job=job, enqueue=enqueued) == []
    assert job.rollouts.count() == 3


@pytest.mark.django_db
def test_rollouts_get_consecutive_finish_numbers_in_the_order_they_finished():
    job = make_job(["a", "b"], samples_per_task=2)
    ids = list(job.rollouts.order_by("-id").values_list("pk", flat=True))  # finish them newest first

    for rollout_id in ids:
        finish(rollout_id, R.FAILED)

    by_seq = list(job.rollouts.order_by("finish_seq").values_list("pk", "finish_seq"))
    assert by_seq == [(rollout_id, seq) for seq, rollout_id in enumerate(ids, start=1)]


@pytest.mark.django_db(transaction=True)
def test_two_rollouts_finishing_at_the_same_moment_never_overspend_the_budget():
    # Each of the two last first-round rollouts makes its task mixed. Planned without the job's row lock,
    # each transaction would see its own task mixed and the other's open, and both would spend the 2
    # samples left: 8 rollouts for a budget of 6. Repeated to give the race many chances.
    for _ in range(5):
        enqueued = Enqueued()
        job = make_job(["a", "b"], sampling="adaptive", samples_per_task=3, adaptive_first_round=2,
                       concurrency=10, enqueue=enqueued)
        a0, a1, b0, b1 = job.rollouts.order_by("task__key", "sample_index")
        finish(a0.pk, R.SUCCEEDED, enqueue=enqueued)
        finish(b0.pk, R.SUCCEEDED, enqueue=enqueued)
        for rollout in (a1, b1):
            rollout_start(rollout_id=rollout.pk, worker=f"w{rollout.pk}")
        _finish_together([a1.pk, b1.pk], enqueued)

        assert job.rollouts.count() == 6, "no more than samples_per_task x tasks"
        seqs = sorted(job.rollouts.exclude(finish_seq=None).values_list("finish_seq", flat=True))
        assert seqs == [1, 2, 3, 4]
        assert sorted(enqueued.ids) == sorted(job.rollouts.values_list("pk", flat=True))


def _finish_together(rollout_ids: list[int], enqueued: Enqueued) -> None:
    from webapp.rollouts.services import rollout_finish

    def fail(rollout_id: int) -> None:
        assert rollout_finish(rollout_id=rollout_id, worker=f"w{rollout_id}", status=R.FAILED, enqueue=enqueued)

    run_together(rollout_ids, fail, timeout=10)
