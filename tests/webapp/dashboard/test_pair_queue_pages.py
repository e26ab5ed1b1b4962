"""A pairwise queue as a browser posts it: made from the pairs page's filters, both runs of the held pair side
by side, A or B better with why; a second curator gets another pair and cannot judge the first's."""

from __future__ import annotations

import pytest

from experience.models import PairwisePreference, ReviewItem, ReviewQueue
from tests.experience.services.store_factories import run_record, stored
from tests.webapp.dashboard.test_queue_pages import curator

pytestmark = pytest.mark.django_db


def test_a_pairs_queue_from_the_pairs_page_shared_by_two_curators():
    stored(*[run_record(task_key="t") for _ in range(3)], run_record(task_key="other"))
    ann, bob = curator("ann"), curator("bob")
    assert 'id="pair-queue-form"' in ann.get("/pairs/?task=t").content.decode()

    made = ann.post("/queues/", {"name": "t pairs", "kind": "pairs", "task": "t"}, follow=True)
    queue = ReviewQueue.objects.get(adhoc=False)  # not the pairs page's own (its claims)
    assert queue.kind == "pairs" and queue.items.count() == 3 and "3 pairs" in made.content.decode()

    ann.post(f"/queues/{queue.pk}/next/")
    bob.post(f"/queues/{queue.pk}/next/")
    held = {item.claimed_by.username: item for item in queue.items.filter(claimed_by__isnull=False)}
    page = ann.get(f"/queues/{queue.pk}/").content.decode()
    mine = held["ann"]
    assert f'data-pair="{mine.trajectory_id},{mine.other_id}"' in page
    assert page.count('class="card pair-side"') == 2 and f"?a={mine.trajectory_id}&amp;b={mine.other_id}" in page
    assert {mine.trajectory_id, mine.other_id} != {held["bob"].trajectory_id, held["bob"].other_id}

    bob.post(f"/queues/{queue.pk}/items/{mine.pk}/decide/", {"decision": "first", "reason": "not bob's"})
    assert not PairwisePreference.objects.exists()
    decided = ann.post(f"/queues/{queue.pk}/items/{mine.pk}/decide/", {"decision": "second", "reason": "tested"},
                       follow=True).content.decode()

    preference = PairwisePreference.objects.get()
    assert (preference.chosen_id, preference.rejected_id, preference.actor.username) == (
        mine.other_id, mine.trajectory_id, "ann")
    assert f"Run {mine.other_id} preferred to run {mine.trajectory_id}." in decided
    assert "1 judged" in decided and "1/3" in decided


def test_a_pair_without_a_reason_is_refused_on_the_page():
    stored(run_record(task_key="t"), run_record(task_key="t"))
    ann = curator("ann")
    ann.post("/queues/", {"name": "p", "kind": "pairs"})
    queue = ReviewQueue.objects.get()
    ann.post(f"/queues/{queue.pk}/next/")
    item = ReviewItem.objects.get()

    shown = ann.post(f"/queues/{queue.pk}/items/{item.pk}/decide/", {"decision": "first"}, follow=True)

    assert "reason: a choice needs a reason" in shown.content.decode() and not PairwisePreference.objects.exists()
