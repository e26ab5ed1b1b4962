"""Pairwise queues: pairs of runs of one task not yet judged, shared by curators through the review queues'
claims (so no two judge the same pair), each decision a PairwisePreference."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from experience.models import PairwisePreference, ReviewItem
from experience.services.preferences import preference_record
from experience.services.review_queues import queue_claim_next, queue_create, queue_decide, queue_progress
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def curators():
    users = get_user_model().objects
    return users.create_user("ann"), users.create_user("bob")


def pairs_of(queue) -> set[frozenset[int]]:
    return {frozenset(p) for p in queue.items.values_list("trajectory_id", "other_id")}


def test_a_pairs_queue_holds_every_unjudged_pair_of_one_task(curators):
    a, b, c = stored(*[run_record(task_key="t") for _ in range(3)])
    (lone,) = stored(run_record(task_key="alone"))
    preference_record(chosen_id=a, rejected_id=b, reason="judged before")

    queue = queue_create(name="pairs", filters={}, kind="pairs")

    assert queue.kind == "pairs" and pairs_of(queue) == {frozenset((a, c)), frozenset((b, c))}
    assert lone not in {pk for pair in pairs_of(queue) for pk in pair}  # a task with one run has no pair
    sample = queue_create(name="one", filters={"task": "t"}, kind="pairs", sample=1, seed=3)
    assert len(pairs_of(sample)) == 1 and pairs_of(sample) <= pairs_of(queue)


def test_no_pair_left_and_a_bad_kind_say_so():
    stored(run_record(task_key="t"))

    with pytest.raises(ValidationError, match="no pair of runs of one task not yet judged matches"):
        queue_create(name="none", filters={}, kind="pairs")
    with pytest.raises(ValidationError, match="kind: one of runs, pairs"):
        queue_create(name="bad", filters={}, kind="triples")


def test_two_curators_never_judge_the_same_pair(curators):
    ann, bob = curators
    stored(*[run_record(task_key="t") for _ in range(3)])
    queue = queue_create(name="pairs", filters={}, kind="pairs")

    first, second = queue_claim_next(queue=queue, user=ann), queue_claim_next(queue=queue, user=bob)
    queue_decide(item=first, user=ann, decision="first", reason="ran the tests")
    queue_decide(item=second, user=bob, decision="second", reason="shorter")
    third = queue_claim_next(queue=queue, user=ann)

    assert len({first.pk, second.pk, third.pk}) == 3 and queue_claim_next(queue=queue, user=bob) is None
    assert set(PairwisePreference.objects.values_list("chosen_id", "rejected_id", "actor__username")) == {
        (first.trajectory_id, first.other_id, "ann"), (second.other_id, second.trajectory_id, "bob")}
    with pytest.raises(Conflict, match="not yours to decide"):
        queue_decide(item=third, user=bob, decision="first", reason="not my pair")
    progress = queue_progress(queue=queue)
    assert (progress["decided"], progress["judged"], progress["held"]) == (2, 2, 1)


def test_an_expired_pair_claim_passes_on_and_the_first_curator_can_no_longer_judge_it(curators):
    ann, bob = curators
    stored(run_record(task_key="t"), run_record(task_key="t"))
    queue = queue_create(name="pairs", filters={}, kind="pairs")
    held = queue_claim_next(queue=queue, user=ann)
    assert queue_claim_next(queue=queue, user=bob) is None

    taken = queue_claim_next(queue=queue, user=bob, now=timezone.now() + timedelta(hours=1))
    queue_decide(item=taken, user=bob, decision="skip")

    assert taken.pk == held.pk
    with pytest.raises(Conflict):
        queue_decide(item=held, user=ann, decision="first", reason="late")
    assert not PairwisePreference.objects.exists()


def test_a_pair_needs_a_reason_and_a_pair_decision(curators):
    ann, _ = curators
    stored(run_record(task_key="t"), run_record(task_key="t"))
    item = queue_claim_next(queue=queue_create(name="pairs", filters={}, kind="pairs"), user=ann)

    with pytest.raises(ValidationError, match="a choice needs a reason"):
        queue_decide(item=item, user=ann, decision="second")
    with pytest.raises(ValidationError, match="decision: one of first, second, skip"):
        queue_decide(item=item, user=ann, decision="approve", reason="runs queues only")
    assert ReviewItem.objects.get(pk=item.pk).decision == ""


def test_a_pair_judged_elsewhere_meanwhile_is_a_conflict_and_stays_held(curators):
    ann, _ = curators
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    item = queue_claim_next(queue=queue_create(name="pairs", filters={}, kind="pairs"), user=ann)
    preference_record(chosen_id=b, rejected_id=a, reason="from the /pairs/ page")

    with pytest.raises(Conflict, match="already"):
        queue_decide(item=item, user=ann, decision="first", reason="too late")

    item.refresh_from_db()
    assert item.decision == "" and item.claimed_by == ann  # the claim's write rolled back with the choice
    queue_decide(item=item, user=ann, decision="skip")
    assert PairwisePreference.objects.count() == 1


def test_a_runs_queue_refuses_pair_decisions(curators):
    ann, _ = curators
    stored(run_record())
    item = queue_claim_next(queue=queue_create(name="runs", filters={}), user=ann)

    with pytest.raises(ValidationError, match="decision: one of approve, reject, skip"):
        queue_decide(item=item, user=ann, decision="first", reason="x")


def test_a_pair_item_that_lost_its_second_run_is_refused_and_nothing_is_recorded(curators):
    ann, _ = curators
    stored(run_record(task_key="t"), run_record(task_key="t"))
    item = queue_claim_next(queue=queue_create(name="pairs", filters={}, kind="pairs"), user=ann)
    ReviewItem.objects.filter(pk=item.pk).update(other=None)  # what queue_create never writes
    item.refresh_from_db()

    with pytest.raises(RuntimeError, match=f"review item {item.pk} of pairs queue {item.queue_id} has no second"):
        queue_decide(item=item, user=ann, decision="first", reason="better")

    item.refresh_from_db()
    assert item.decision == "" and item.claimed_by == ann and PairwisePreference.objects.count() == 0
