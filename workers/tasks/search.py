"""Search indexing runs after ingest, not during it (it would cut bulk ingest to a fraction): this beat task
indexes the runs waiting, in batches. Idempotent and safe to run concurrently (SKIP LOCKED inside)."""

from __future__ import annotations

from celery import shared_task

from experience.services.search_index import search_index_update

BATCHES_PER_TICK = 20


@shared_task(name="trove.search.index", ignore_result=True)
def index_pending_runs() -> int:
    # Bounded per tick so one beat interval never runs long; the next tick continues.
    total = 0
    for _ in range(BATCHES_PER_TICK):
        done = search_index_update()
        if not done:
            break
        total += done
    return total
