"""Review queues: made from explorer filters (or a random sample of the runs they match), worked through by
curators one run at a time, shared without reviewing a run twice.

A claim is a conditional write under `SELECT … FOR UPDATE SKIP LOCKED` (as fleets claim sandboxes): two
curators asking at the same moment get different items, and neither waits on the other. A claim lasts
TROVE_REVIEW_CLAIM_SECONDS; an item whose claim ran out without a decision goes to the next curator who asks.
A decision is taken once, by the holder of the claim; approve and reject are curations of the run too
(services.curation, with their CurationEvents).
"""

from __future__ import annotations

import random
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

MAX_ITEMS = 10_000
D = ReviewItem.Decision


def queue_create(*, name: str, filters: dict[str, str], sample: int | None = None, actor: Any = None,
                 seed: int | None = None) -> ReviewQueue:
    """A queue of the runs matching the explorer `filters` (newest first), or a random `sample` of them.
    Raises ValidationError for a bad filter, an empty match, or more than MAX_ITEMS runs without a sample."""
    name = name.strip()
    if not name:
        raise ValidationError("name: a queue needs a name", field="name")
    if sample is not None and sample < 1:
        raise ValidationError("sample: at least 1", field="sample")
    ids = list(trajectory_search(filters=filters_from_params(filters)).values_list("pk", flat=True)[: MAX_ITEMS + 1])
    if sample is not None and sample < len(ids):
        ids = sorted(random.Random(seed).sample(ids, sample), reverse=True)
    if not ids:
        raise ValidationError("filters: no run matches them, so the queue would be empty", field="filters")
    if len(ids) > MAX_ITEMS:
        raise ValidationError(f"filters: more than {MAX_ITEMS} runs match; narrow them or take a sample",
                              field="sample")
    with transaction.atomic():
        queue = ReviewQueue.objects.create(name=name, filters=filters, sample=sample, created_by=actor)
        ReviewItem.objects.bulk_create(
            [ReviewItem(queue=queue, trajectory_id=pk, position=n) for n, pk in enumerate(ids)], batch_size=1000)
    return queue


def queue_current(*, queue: ReviewQueue, user: Any) -> ReviewItem | None:
    """The undecided item `user` holds a live claim on, if any."""
    return (ReviewItem.objects.filter(queue=queue, decision="", claimed_by=user, claimed_until__gt=timezone.now())
            .select_related("trajectory").order_by("position").first())


def queue_claim_next(*, queue: ReviewQueue, user: Any, now=None) -> ReviewItem | None:
    """The user's current item, or the next open one claimed for them (None when nothing is left open).
    Never an item someone else holds a live claim on; never a decided one."""
    current = queue_current(queue=queue, user=user)
    if current is not None:
        return current
    now = now or timezone.now()
    with transaction.atomic():
        item = (ReviewItem.objects.select_for_update(skip_locked=True)
                .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now), queue=queue, decision="")
                .order_by("position").first())
        if item is None:
            return None
        item.claimed_by, item.claimed_until = user, now + timedelta(seconds=settings.TROVE_REVIEW_CLAIM_SECONDS)
        item.save(update_fields=["claimed_by", "claimed_until"])
    return ReviewItem.objects.select_related("trajectory").get(pk=item.pk)


def queue_decide(*, item: ReviewItem, user: Any, decision: str, reason: str = "") -> ReviewItem:
    """Decide the item the user holds: approve / reject (a reason required) / skip. Approve and reject
    curate the run. Conflict when the user does not hold it or it was decided."""
    if decision not in D.values:
        raise ValidationError(f"decision: one of {', '.join(D.values)}", field="decision")
    reason = reason.strip()
    if decision == D.REJECT and not reason:
        raise ValidationError("reason: a rejection needs a reason", field="reason")
    with transaction.atomic():
        claimed = ReviewItem.objects.filter(pk=item.pk, decision="", claimed_by=user).update(
            decision=decision, reason=reason, decided_by=user, decided_at=timezone.now(), claimed_until=None)
        if not claimed:
            raise Conflict(f"run {item.trajectory_id} in this queue is not yours to decide (decided, or claimed "
                           "by someone else after your claim ran out)", field="item")
        if decision != D.SKIP:
            trajectories_curate(trajectories=[item.trajectory_id], action=decision, actor=user,
                                reason=reason or f"review queue {item.queue_id}")
    item.refresh_from_db()
    return item


def queue_progress(*, queue: ReviewQueue, now=None) -> dict[str, int]:
    """How far the queue is: items, decided (by decision), held now, open (one query)."""
    now = now or timezone.now()
    counts = ReviewItem.objects.filter(queue=queue).aggregate(
        total=Count("id"), decided=Count("id", filter=~Q(decision="")),
        approved=Count("id", filter=Q(decision=D.APPROVE)), rejected=Count("id", filter=Q(decision=D.REJECT)),
        skipped=Count("id", filter=Q(decision=D.SKIP)),
        held=Count("id", filter=Q(decision="", claimed_until__gt=now)))
    counts["open"] = counts["total"] - counts["decided"] - counts["held"]
    counts["percent"] = round(100 * counts["decided"] / counts["total"]) if counts["total"] else 0
    return counts
