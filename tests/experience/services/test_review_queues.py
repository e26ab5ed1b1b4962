"""Review queues: made from filters or a sample; shared by curators through claims that expire; each run
decided once, by the holder of its claim; approve and reject curate the run."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from experience.models import CurationEvent, ReviewItem, Trajectory
from experience.services.review_queues import queue_claim_next, queue_create, queue_decide, queue_progress
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def curators():
    users = get_user_model().objects
    return users.create_user("ann"), users.create_user("bob")


def test_a_queue_holds_the_runs_its_filters_match_or_a_sample_of_them(curators):
    runs = stored(*[run_record(model="m-q") for _ in range(5)], run_record(model="other"))

    everything = queue_create(name="all m-q", filters={"model": "m-q"}, actor=curators[0])
    sample = queue_create(name="three", filters={"model": "m-q"}, sample=3, seed=7)

    assert list(everything.items.order_by("position").values_list("trajectory_id", flat=True)) == runs[:5][::-1]
    picked = set(sample.items.values_list("trajectory_id", flat=True))
    assert len(picked) == 3 and picked <= set(runs[:5])
    with pytest.raises(ValidationError, match="no run matches"):
        queue_create(name="none", filters={"model": "nope"})
    with pytest.raises(ValidationError, match="not a filter"):
        queue_create(name="bad", filters={"colour": "red"})


def test_two_curators_never_get_the_same_run(curators):
    ann, bob = curators
    stored(run_record(), run_record())
    queue = queue_create(name="q", filters={})

    first, second = queue_claim_next(queue=queue, user=ann), queue_claim_next(queue=queue, user=bob)

    assert first.trajectory_id != second.trajectory_id
    assert queue_claim_next(queue=queue, user=ann).pk == first.pk  # asking again resumes one's own
    assert queue_progress(queue=queue)["held"] == 2


@pytest.mark.django_db(transaction=True)
def test_claims_made_at_the_same_moment_skip_each_others_rows(curators):
    ann, bob = curators
    stored(*[run_record() for _ in range(4)])
    queue = queue_create(name="q", filters={})
    got, barrier = {}, threading.Barrier(2)

    def claim(user):
        barrier.wait()
        got[user.username] = queue_claim_next(queue=queue, user=user).trajectory_id
        connection.close()

    threads = [threading.Thread(target=claim, args=(u,)) for u in (ann, bob)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert got["ann"] != got["bob"]


def test_an_expired_claim_goes_to_the_next_curator_and_the_first_may_no_longer_decide(curators):
    ann, bob = curators
    stored(run_record())
    queue = queue_create(name="q", filters={})
    item = queue_claim_next(queue=queue, user=ann)
    assert queue_claim_next(queue=queue, user=bob) is None  # held by ann

    later = timezone.now() + timedelta(hours=1)
    taken = queue_claim_next(queue=queue, user=bob, now=later)
    queue_decide(item=taken, user=bob, decision="approve")

    assert taken.pk == item.pk
    with pytest.raises(Conflict, match="not yours to decide"):
        queue_decide(item=item, user=ann, decision="reject", reason="late")
    assert Trajectory.objects.get(pk=item.trajectory_id).curation_status == "approved"


def test_decisions_curate_the_run_and_reject_needs_a_reason(curators):
    ann, _ = curators
    a, b = stored(run_record(), run_record())
    queue = queue_create(name="q", filters={})

    item = queue_claim_next(queue=queue, user=ann)
    with pytest.raises(ValidationError, match="needs a reason"):
        queue_decide(item=item, user=ann, decision="reject")
    queue_decide(item=item, user=ann, decision="reject", reason="hardcodes the answer")
    skipped = queue_decide(item=queue_claim_next(queue=queue, user=ann), user=ann, decision="skip")

    assert Trajectory.objects.get(pk=item.trajectory_id).curation_status == "rejected"
    assert CurationEvent.objects.get(action="reject").reason == "hardcodes the answer"
    assert Trajectory.objects.get(pk=skipped.trajectory_id).curation_status == "pending"
    assert queue_claim_next(queue=queue, user=ann) is None
    progress = queue_progress(queue=queue)
    assert (progress["decided"], progress["rejected"], progress["skipped"], progress["percent"]) == (2, 1, 1, 100)
    assert set(ReviewItem.objects.values_list("decided_by__username", flat=True)) == {"ann"}
