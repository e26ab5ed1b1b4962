"""The sampling policies' core, without a database."""

from __future__ import annotations

from webapp.rollouts.sampling import (
    ALWAYS_FAILED,
    ALWAYS_PASSED,
    BUDGET_SPENT,
    NO_OUTCOMES,
    QUOTA_REACHED,
    Policy,
    TaskTally,
    may_still_spend,
    plan,
    score,
    stop_reason,
    task_summary,
)

ADAPTIVE = Policy(name="adaptive", samples_per_task=4, first_round=2)


def test_uniform_plans_nothing_after_creation_because_every_sample_was_issued_up_front():
    tallies = [TaskTally(task_id=1, issued=4, succeeded=2, failed=2), TaskTally(task_id=2, issued=4, running=4)]
    policy = Policy(name="uniform", samples_per_task=4)

    assert policy.first_round_size == 4
    assert plan(tallies, policy, slots=10) == []
    assert may_still_spend(tallies, policy) == 0


def test_the_first_round_never_exceeds_a_tasks_share_of_the_budget():
    assert Policy(name="adaptive", samples_per_task=3, first_round=5).first_round_size == 3
    assert Policy(name="adaptive", samples_per_task=8, first_round=0).first_round_size == 1


def test_tasks_that_always_passed_or_always_failed_get_nothing_more():
    tallies = [
        TaskTally(task_id=1, issued=2, succeeded=2),
        TaskTally(task_id=2, issued=2, failed=2),
        TaskTally(task_id=3, issued=2, infra_error=2),
    ]

    assert plan(tallies, ADAPTIVE, slots=8) == []
    assert [stop_reason(t, ADAPTIVE) for t in tallies] == [ALWAYS_PASSED, ALWAYS_FAILED, NO_OUTCOMES]
    assert may_still_spend(tallies, ADAPTIVE) == 0


def test_a_task_whose_first_round_is_still_out_is_neither_sampled_nor_stopped():
    waiting = TaskTally(task_id=1, issued=2, succeeded=1, running=1)

    assert stop_reason(waiting, ADAPTIVE) is None
    assert plan([waiting], ADAPTIVE, slots=4) == []
    assert may_still_spend([waiting], ADAPTIVE) == 2


def test_remaining_budget_goes_to_mixed_tasks_and_never_past_the_budget():
    tallies = [
        TaskTally(task_id=1, issued=2, succeeded=2),
        TaskTally(task_id=2, issued=2, succeeded=1, failed=1),
        TaskTally(task_id=3, issued=2, failed=2),
    ]

    picks = plan(tallies, ADAPTIVE, slots=100)

    assert len(picks) == 12 - 6
    assert set(picks) == {2}


def test_it_plans_no_more_than_the_free_slots():
    tallies = [TaskTally(task_id=1, issued=2, succeeded=1, failed=1), TaskTally(task_id=2, issued=2, succeeded=1, failed=1)]

    assert len(plan(tallies, ADAPTIVE, slots=3)) == 3
    assert plan(tallies, ADAPTIVE, slots=0) == []
    assert plan(tallies, ADAPTIVE, slots=-2) == []


def test_the_most_uncertain_task_is_sampled_first():
    balanced = TaskTally(task_id=7, issued=4, succeeded=2, failed=2)  # smoothed 0.5
    lopsided = TaskTally(task_id=3, issued=4, succeeded=3, failed=1)  # smoothed 0.667

    assert score(balanced) > score(lopsided)
    assert plan([lopsided, balanced], Policy(name="adaptive", samples_per_task=8, first_round=2), slots=1) == [7]


def test_samples_in_flight_spread_concurrent_picks_over_the_mixed_tasks():
    tallies = [TaskTally(task_id=1, issued=2, succeeded=1, failed=1), TaskTally(task_id=2, issued=2, succeeded=1, failed=1)]

    picks = plan(tallies, Policy(name="adaptive", samples_per_task=10, first_round=2), slots=4)

    assert sorted(picks) == [1, 1, 2, 2]


def test_planning_is_deterministic():
    tallies = [TaskTally(task_id=i, issued=2, succeeded=1, failed=1) for i in range(5)]
    policy = Policy(name="adaptive", samples_per_task=6, first_round=2)

    assert plan(tallies, policy, slots=7) == plan(list(reversed(tallies)), policy, slots=7)


def test_the_summary_says_why_a_task_stopped():
    mixed_done = TaskTally(task_id=1, issued=5, started=5, succeeded=2, failed=3)
    always = TaskTally(task_id=2, issued=2, started=2, succeeded=2)

    row = task_summary(mixed_done, ADAPTIVE, budget_left=0, job_open=False)
    assert row == {"task_id": 1, "spent": 5, "issued": 5, "queued": 0, "running": 0, "open": 0, "succeeded": 2,
                   "failed": 3, "infra_error": 0, "cancelled": 0, "pass_rate": 0.4, "stopped": True,
                   "stopped_because": BUDGET_SPENT}
    assert task_summary(always, ADAPTIVE, budget_left=3, job_open=True)["stopped_because"] == ALWAYS_PASSED
    assert task_summary(TaskTally(task_id=3, issued=2, running=2), ADAPTIVE, budget_left=3, job_open=True)["stopped"] is False


def test_a_uniform_task_has_spent_only_what_was_issued_and_stops_once_nothing_of_it_is_left_to_run():
    uniform = Policy(name="uniform", samples_per_task=3)
    waiting = TaskTally(task_id=1, issued=3, queued=3)
    half = TaskTally(task_id=1, issued=3, started=2, queued=1, running=1, succeeded=1)
    running = TaskTally(task_id=1, issued=3, started=3, running=1, succeeded=1, failed=1)
    done = TaskTally(task_id=1, issued=3, started=3, succeeded=2, failed=1)

    rows = [task_summary(t, uniform, budget_left=0, job_open=True) for t in (waiting, half, running, done)]

    assert [row["spent"] for row in rows] == [0, 2, 3, 3], "spent: issued to a worker, not created"
    assert [row["stopped_because"] for row in rows] == [None, None, None, QUOTA_REACHED]
    assert [row["stopped"] for row in rows] == [False, False, False, True]
