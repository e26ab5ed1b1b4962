"""Claims on the ad-hoc pairs page (/pairs/): curators judging pairs straight from a filter share the review
queues' claims, so two of them never get the same pair at once and a pair whose claim ran out goes to the next.

The page has no queue of its own making, so it has one standing pairs queue (`ReviewQueue.adhoc`) whose items
are the pairs it has offered; whichever filter a curator uses, a pair is one item, so a claim holds across
filters. Each visit takes the filter's first unjudged pairs (enough to pass every live claim), adds those not
yet items, and claims among them with `queue_claim_next`: its expiry, its SKIP LOCKED, its rules. A judgement
is `queue_decide` on that item (only its holder may), recorded as a PairwisePreference, so a judged pair is
never a candidate again, here or in any queue made later.
"""

from __future__ import annotations

from functools import reduce
from operator import or_
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from experience.models import ReviewItem, ReviewQueue
from experience.services.preferences import unjudged_pairs
from experience.services.review_queues import queue_claim_next, queue_current, queue_decide

ADHOC_NAME = "The pairs page (/pairs/)"
# Candidates beyond the live claims: room for curators who claim in the same moment (each then takes one).
SPARE_CANDIDATES = 10
ATTEMPTS = 3
CHOICES = {"a": ReviewItem.Decision.FIRST, "b": ReviewItem.Decision.SECOND}


def adhoc_pairs_queue() -> ReviewQueue:
    """The standing queue behind /pairs/, made on first use (one per database: a unique constraint)."""
    queue = ReviewQueue.objects.filter(kind=ReviewQueue.Kind.PAIRS, adhoc=True).first()
    if queue is not None:
        return queue
    try:
        with transaction.atomic():
            return ReviewQueue.objects.create(name=ADHOC_NAME, kind=ReviewQueue.Kind.PAIRS, adhoc=True)
    except IntegrityError:  # made by a concurrent first visit
        return ReviewQueue.objects.get(kind=ReviewQueue.Kind.PAIRS, adhoc=True)


def adhoc_pair_claim(*, trajectories, user: Any, now=None) -> ReviewItem | None:
    """The pair of runs among `trajectories` (a queryset) that `user` holds, or the next unjudged one nobody
    else holds, claimed for them; None when every pair is judged or held. Claiming a new pair gives back
    any other the user held here (they moved on)."""
    queue = adhoc_pairs_queue()
    now = now or timezone.now()
    held = _still_offered(queue_current(queue=queue, user=user), trajectories)
    if held is not None:
        return held
    for _ in range(ATTEMPTS):
        limit = ReviewItem.objects.filter(queue=queue, decision="", claimed_until__gt=now).count() + SPARE_CANDIDATES
        candidates = unjudged_pairs(trajectories=trajectories, limit=limit)
        item = queue_claim_next(queue=queue, user=user, now=now, among=_items_for(queue, candidates))
        if item is not None:
            ReviewItem.objects.filter(queue=queue, decision="", claimed_by=user).exclude(pk=item.pk).update(
                claimed_until=None)
            return item
        if len(candidates) < limit:  # every candidate there is, held by others
            return None
    return None


def adhoc_pair_judge(*, first_id: int, second_id: int, choice: str, reason: str, user: Any) -> ReviewItem:
    """Judge the pair the page offered `user` (`first_id`, `second_id` as it showed them): `choice` "a" when
    the first is better, "b" the second. ValidationError for a bad choice or no reason; Conflict when the
    page never offered this pair, or the user's claim ran out and someone else took it, or it is judged."""
    if choice not in CHOICES:
        raise ValidationError("choice: a or b, the run that did better", field="choice")
    item = (ReviewItem.objects.select_related("queue")
            .filter(queue=adhoc_pairs_queue(), trajectory_id=first_id, other_id=second_id).first())
    if item is None:
        raise Conflict(f"runs {first_id} and {second_id}: not a pair this page offered you; load it again",
                       field="item")
    return queue_decide(item=item, user=user, decision=CHOICES[choice], reason=reason)


def _still_offered(item: ReviewItem | None, trajectories) -> ReviewItem | None:
    """The user's held pair if this filter still offers it: both runs match and nobody judged it since."""
    if item is None or item.other_id is None:
        return None
    pair = {item.trajectory_id, item.other_id}
    if trajectories.filter(pk__in=pair).count() != 2:
        return None
    offered = unjudged_pairs(trajectories=trajectories.filter(pk__in=pair), limit=1)
    return item if offered else None


def _items_for(queue: ReviewQueue, pairs: list[tuple[int, int]]) -> list[int]:
    """The queue's undecided items for `pairs`, made for those that are not items yet (ids)."""
    if not pairs:
        return []
    start = ReviewItem.objects.filter(queue=queue).count()
    ReviewItem.objects.bulk_create([ReviewItem(queue=queue, trajectory_id=a, other_id=b, position=start + n)
                                    for n, (a, b) in enumerate(pairs)], ignore_conflicts=True)
    match = reduce(or_, (Q(trajectory_id=a, other_id=b) for a, b in pairs))
    return list(ReviewItem.objects.filter(match, queue=queue, decision="").values_list("pk", flat=True))
