"""Review queues: made from explorer filters (or a random sample of the runs they match), worked through by
curators one run at a time, shared without reviewing a run twice. A pairs queue holds pairs of runs of the
same task instead (each not yet judged when the queue is made); deciding one records a PairwisePreference.
Both kinds share the claims below, so two curators never judge the same pair either.

A claim is a conditional write under `SELECT … FOR UPDATE SKIP LOCKED` (as fleets claim sandboxes): two
curators asking at the same moment get different items, and neither waits on the other. A claim lasts
TROVE_REVIEW_CLAIM_SECONDS; an item whose claim ran out without a decision goes to the next curator who asks.
A decision is taken once, by the holder of the claim; approve and reject are curations of the run too
(services.curation, with their CurationEvents).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from experience.models import ReviewItem, ReviewQueue
from experience.search import filters_from_params, trajectory_search
from experience.services.curation import trajectories_curate
from experience.services.preferences import preference_record, unjudged_pairs

MAX_ITEMS = 10_000
D = ReviewItem.Decision
K = ReviewQueue.Kind
DECISIONS: dict[str, tuple[str, ...]] = {K.RUNS: (D.APPROVE, D.REJECT, D.SKIP), K.PAIRS: (D.FIRST, D.SECOND, D.SKIP)}


def queue_create(*, name: str, filters: dict[str, str], sample: int | None = None, actor: Any = None,
                 seed: int | None = None, kind: str = K.RUNS) -> ReviewQueue:
    """A queue of the runs matching the explorer `filters` (newest first), or a random `sample` of them; a
    pairs queue (`kind="pairs"`) of the unjudged pairs of runs of one task among them (unjudged_pairs'
    order), or a sample of those. Raises ValidationError for a bad kind or filter, an empty queue, or more
    than MAX_ITEMS items without a sample."""
    name = name.strip()
    if not name:
        raise ValidationError("name: a queue needs a name", field="name")
    if kind not in K.values:
        raise ValidationError(f"kind: one of {', '.join(K.values)}", field="kind")
    if sample is not None and sample < 1:
        raise ValidationError("sample: at least 1", field="sample")
    runs = trajectory_search(filters=filters_from_params(filters))
    if kind == K.PAIRS:
        entries: list[tuple[int, int | None]] = list(unjudged_pairs(trajectories=runs, limit=MAX_ITEMS + 1))
        what = "pair of runs of one task not yet judged"
    else:
        entries = [(pk, None) for pk in runs.values_list("pk", flat=True)[: MAX_ITEMS + 1]]
        what = "run"
    if sample is not None and sample < len(entries):
        chosen = set(random.Random(seed).sample(range(len(entries)), sample))
        entries = [entry for n, entry in enumerate(entries) if n in chosen]
    if not entries:
        raise ValidationError(f"filters: no {what} matches them, so the queue would be empty", field="filters")
    if len(entries) > MAX_ITEMS:
        raise ValidationError(f"filters: more than {MAX_ITEMS} items match; narrow them or take a sample",
                              field="sample")
    with transaction.atomic():
        queue = ReviewQueue.objects.create(name=name, kind=kind, filters=filters, sample=sample, created_by=actor)
        ReviewItem.objects.bulk_create([ReviewItem(queue=queue, trajectory_id=pk, other_id=other, position=n)
                                        for n, (pk, other) in enumerate(entries)], batch_size=1000)
    return queue


def queue_current(*, queue: ReviewQueue, user: Any, among: Collection[int] | None = None) -> ReviewItem | None:
    """The undecided item `user` holds a live claim on, if any (only of the items `among`, when given)."""
    items = ReviewItem.objects.filter(queue=queue, decision="", claimed_by=user, claimed_until__gt=timezone.now())
    if among is not None:
        items = items.filter(pk__in=among)
    return items.select_related("trajectory", "other").order_by("position").first()


def queue_claim_next(*, queue: ReviewQueue, user: Any, now=None,
                     among: Collection[int] | None = None) -> ReviewItem | None:
    """The user's current item, or the next open one claimed for them (None when nothing is left open).
    Never an item someone else holds a live claim on; never a decided one. `among` (item ids) narrows both
    to those items: the ad-hoc pairs page's candidates (services.pair_claims)."""
    current = queue_current(queue=queue, user=user, among=among)
    if current is not None:
        return current
    now = now or timezone.now()
    with transaction.atomic():
        open_items = (ReviewItem.objects.select_for_update(skip_locked=True)
                      .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now), queue=queue, decision=""))
        if among is not None:
            open_items = open_items.filter(pk__in=among)
        item = open_items.order_by("position").first()
        if item is None:
            return None
        item.claimed_by, item.claimed_until = user, now + timedelta(seconds=settings.TROVE_REVIEW_CLAIM_SECONDS)
        item.save(update_fields=["claimed_by", "claimed_until"])
    return ReviewItem.objects.select_related("trajectory", "other").get(pk=item.pk)


def queue_decide(*, item: ReviewItem, user: Any, decision: str, reason: str = "") -> ReviewItem:
    """Decide the item the user holds. A run: approve / reject (a reason required) / skip; approve and reject
    curate the run. A pair: first / second (which run is better; a reason required), recorded as a
    PairwisePreference, or skip. Conflict when the user does not hold the item or it was decided, or when the
    pair was judged meanwhile elsewhere (the item stays theirs: skip it)."""
    kind = item.queue.kind
    if decision not in DECISIONS[kind]:
        raise ValidationError(f"decision: one of {', '.join(DECISIONS[kind])}", field="decision")
    reason = reason.strip()
    if decision in (D.REJECT, D.FIRST, D.SECOND) and not reason:
        raise ValidationError(f"reason: {'a rejection' if decision == D.REJECT else 'a choice'} needs a reason",
                              field="reason")
    with transaction.atomic():
        _close_claim(item=item, user=user, decision=decision, reason=reason)
        if decision in (D.APPROVE, D.REJECT):
            trajectories_curate(trajectories=[item.trajectory_id], action=decision, actor=user,
                                reason=reason or f"review queue {item.queue_id}")
        elif decision != D.SKIP:
            if item.other_id is None:  # queue_create makes every item of a pairs queue a pair: a bug, not input
                raise RuntimeError(f"review item {item.pk} of pairs queue {item.queue_id} has no second run")
            better, worse = ((item.trajectory_id, item.other_id) if decision == D.FIRST
                             else (item.other_id, item.trajectory_id))
            preference_record(chosen_id=better, rejected_id=worse, reason=reason, actor=user)
    item.refresh_from_db()
    return item


def _close_claim(*, item: ReviewItem, user: Any, decision: str, reason: str) -> None:
    """Decide `item` if `user` still holds it, in one conditional write (the caller's transaction): 0 rows
    means decided already, or claimed by someone else after the user's claim ran out."""
    claimed = ReviewItem.objects.filter(pk=item.pk, decision="", claimed_by=user).update(
        decision=decision, reason=reason, decided_by=user, decided_at=timezone.now(), claimed_until=None)
    if not claimed:
        what = f"runs {item.trajectory_id} and {item.other_id}" if item.other_id else f"run {item.trajectory_id}"
        raise Conflict(f"{what} in this queue: not yours to decide (decided, or claimed by someone else after "
                       "your claim ran out)", field="item")


def queue_progress(*, queue: ReviewQueue, now=None) -> dict[str, int]:
    """How far the queue is: items, decided (by decision), held now, open (one query)."""
    now = now or timezone.now()
    counts = ReviewItem.objects.filter(queue=queue).aggregate(
        total=Count("id"), decided=Count("id", filter=~Q(decision="")),
        approved=Count("id", filter=Q(decision=D.APPROVE)), rejected=Count("id", filter=Q(decision=D.REJECT)),
        skipped=Count("id", filter=Q(decision=D.SKIP)),
        judged=Count("id", filter=Q(decision__in=[D.FIRST, D.SECOND])),
        held=Count("id", filter=Q(decision="", claimed_until__gt=now)))
    counts["open"] = counts["total"] - counts["decided"] - counts["held"]
    counts["percent"] = round(100 * counts["decided"] / counts["total"]) if counts["total"] else 0
    return counts
