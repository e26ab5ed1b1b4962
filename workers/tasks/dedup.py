"""Dedup tasks. Both are idempotent (`trajectory_dedup` keeps a run's place and skips unchanged signatures),
so they may run with acks_late; a lost database connection is retried with backoff. The beat's
`dedup_pending` picks up every finished run not yet embedded, whichever path stored it (rollout, import,
API), so no writer has to remember to enqueue; `enqueue_dedup` lets one that knows its ids go first."""

from __future__ import annotations

from collections.abc import Sequence

from celery import shared_task
from django.db import InterfaceError, OperationalError, transaction

from experience.services.dedup import dedup_pending, trajectory_dedup

MAX_RETRIES = 3


@shared_task(name="trove.experience.dedup", bind=True, acks_late=True, ignore_result=True, max_retries=MAX_RETRIES)
def dedup_trajectories(self, trajectory_ids: list[int]) -> dict:
    try:
        return trajectory_dedup(trajectory_ids=trajectory_ids).as_dict()
    except (OperationalError, InterfaceError) as error:
        raise self.retry(exc=error, countdown=5 * 2**self.request.retries) from error


@shared_task(name="trove.experience.dedup_pending", acks_late=True, ignore_result=True)
def dedup_pending_batch() -> dict:
    # No retry: the next beat tick (seconds away) picks up whatever this one left.
    return dedup_pending().as_dict()


def enqueue_dedup(trajectory_ids: Sequence[int]) -> None:
    """Dedup these runs once the caller's transaction commits (the task must see them finished)."""
    ids = [int(i) for i in trajectory_ids]
    transaction.on_commit(lambda: dedup_trajectories.delay(ids))
