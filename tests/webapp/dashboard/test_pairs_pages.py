"""The pairwise page as a browser posts it: the button pressed decides which run is chosen; a reason is
required; a reader may look but not choose. Curators on the page hold the pair shown with the review queues'
claim: two never get the same pair, a claim runs out, a judged pair is never offered again."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from experience.models import PairwisePreference, ReviewItem, ReviewQueue
from experience.services.pair_claims import ADHOC_NAME
from experience.services.preferences import preference_record
from tests.experience.services.store_factories import run_record, stored
from tests.webapp.dashboard.test_queue_pages import curator
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


def client_in(role: str | None) -> Client:
    client = Client()
    user = get_user_model().objects.create_user(f"u-{role}")
    if role:
        user.groups.add(role_groups_sync()[role])
    client.force_login(user)
    return client


def test_the_pressed_button_picks_the_chosen_run_and_a_reason_is_needed():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    curator = client_in("curator")

    page = curator.get("/pairs/", {"task": "t"}).content.decode()
    first, second = shown(curator, task="t")  # newest first
    curator.post("/pairs/", {"a": first, "b": second, "choice": "b", "reason": "", "task": "t"})
    assert not PairwisePreference.objects.exists()
    answer = curator.post("/pairs/", {"a": first, "b": second, "choice": "b", "reason": "shorter", "task": "t"})

    assert f'data-run="{a}"' in page and f'data-run="{b}"' in page and {first, second} == {a, b}
    assert answer["Location"] == "/pairs/?task=t"
    assert PairwisePreference.objects.values_list("chosen_id", "rejected_id", "reason").get() == \
        (second, first, "shorter")


def test_a_reader_looks_but_may_not_choose():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    reader = client_in(None)

    assert reader.get("/pairs/").status_code == 200
    assert not ReviewItem.objects.exists(), "a reader looks without claiming"
    assert reader.post("/pairs/", {"a": a, "b": b, "choice": "a", "reason": "x"}).status_code == 403
    assert not PairwisePreference.objects.exists()


# --- claims: the page shares the review queues' claims (experience.services.pair_claims) -------------------

def shown(client: Client, **params) -> tuple[int, int] | None:
    """The pair the page offers this client (its form's a and b), or None."""
    page = client.get("/pairs/", params).content.decode()
    found = re.search(r'name="a" value="(\d+)"><input type="hidden" name="b" value="(\d+)"', page)
    return (int(found[1]), int(found[2])) if found else None


def judge(client: Client, pair: tuple[int, int], choice: str = "a", **params) -> str:
    answer = client.post("/pairs/", {"a": pair[0], "b": pair[1], "choice": choice, "reason": "ran the tests",
                                     **params}, follow=True)
    return answer.content.decode()


def test_two_curators_on_the_page_get_different_pairs_and_each_keeps_theirs():
    stored(*[run_record(task_key="t") for _ in range(3)])
    ann, bob = curator("ann"), curator("bob")

    ann_pair, bob_pair = shown(ann, task="t"), shown(bob, task="t")

    assert ann_pair and bob_pair and set(ann_pair) != set(bob_pair)
    assert shown(ann, task="t") == ann_pair and shown(bob) == bob_pair  # a claim holds across filters
    assert "This pair is yours until" in ann.get("/pairs/", {"task": "t"}).content.decode()
    assert set(ReviewItem.objects.filter(claimed_until__isnull=False).values_list("claimed_by__username", flat=True)) \
        == {"ann", "bob"}


def test_a_claim_that_ran_out_goes_to_the_next_curator_and_the_first_may_no_longer_judge_it():
    stored(run_record(task_key="t"), run_record(task_key="t"))
    ann, bob = curator("ann"), curator("bob")
    pair = shown(ann)

    waiting = bob.get("/pairs/").content.decode()
    ReviewItem.objects.filter(claimed_by__username="ann").update(claimed_until=timezone.now() - timedelta(seconds=1))
    taken = shown(bob)
    refused = judge(ann, pair)

    assert pair and 'id="all-held"' in waiting and 'name="a"' not in waiting
    assert taken == pair
    assert "not yours to decide" in refused and not PairwisePreference.objects.exists()
    assert "preferred to run" in judge(bob, pair, choice="b")
    assert PairwisePreference.objects.values_list("chosen_id", "rejected_id", "actor__username").get() == \
        (pair[1], pair[0], "bob")


def test_a_judged_pair_is_not_offered_again_to_anyone():
    stored(*[run_record(task_key="t") for _ in range(3)])
    ann, bob = curator("ann"), curator("bob")

    first = shown(ann)
    judge(ann, first)
    offered = [shown(ann), shown(bob)]
    judge(ann, offered[0])
    judge(bob, offered[1])

    assert first not in offered and offered[0] != offered[1]
    assert {frozenset(p) for p in PairwisePreference.objects.values_list("chosen_id", "rejected_id")} == \
        {frozenset(first), frozenset(offered[0]), frozenset(offered[1])}
    assert shown(ann) is None and 'id="no-pairs"' in bob.get("/pairs/").content.decode()


def test_a_pair_judged_elsewhere_while_held_gives_way_to_the_next():
    a, b, c = stored(*[run_record(task_key="t") for _ in range(3)])
    ann = curator("ann")
    held = shown(ann)

    preference_record(chosen_id=held[0], rejected_id=held[1], reason="judged in a queue meanwhile")
    after = shown(ann)

    assert after and set(after) != set(held)
    assert ReviewItem.objects.filter(claimed_by__username="ann", claimed_until__gt=timezone.now()).count() == 1


def test_a_pair_the_page_did_not_offer_or_a_bad_choice_is_refused_by_name():
    a, b = stored(run_record(task_key="t"), run_record(task_key="t"))
    ann, bob = curator("ann"), curator("bob")
    pair = shown(ann)

    never_offered = judge(bob, (pair[1], pair[0]))
    held_by_ann = judge(bob, pair)
    bad_choice = judge(ann, pair, choice="c")

    assert "not a pair this page offered you" in never_offered
    assert "not yours to decide" in held_by_ann
    assert "choice: a or b" in bad_choice
    assert not PairwisePreference.objects.exists()


def test_the_pages_own_queue_is_not_listed_with_the_queues_people_make():
    stored(run_record(task_key="t"), run_record(task_key="t"))
    ann = curator("ann")
    shown(ann)

    assert ReviewQueue.objects.filter(adhoc=True).count() == 1
    assert ADHOC_NAME not in ann.get("/queues/").content.decode()
