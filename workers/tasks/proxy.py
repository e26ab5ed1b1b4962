"""The proxy's record ingest on the full stack: beat sends `trove.proxy.ingest` every second.

Thin: the stream consumer lives in webapp/proxy/wiring.py. At most one scheduled ingest runs at a time per
stream (a Redis lock that expires by itself if its holder dies), so a busy stream never fills the workers
with ingest runs; a run ends as soon as the stream is empty, or after INGEST_MAX_S, and the next tick takes over.
Rollout runners drain the stream too while they wait for their calls (`ingest_pending_records`), without
the lock. Safe to run twice at once and to redeliver: the writer is idempotent by call id.
"""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from django.conf import settings

from webapp.proxy.locations import proxy_stream
from webapp.proxy.wiring import ingest_stream, prune_abandoned_consumers, redis_client
from workers.identity import execution_id

log = logging.getLogger("trove.proxy")

INGEST_MAX_S = 5.0
# The scheduled ingest drains what is in the stream and ends: a read that blocked for new entries would hold a
# worker slot for a second each tick (beat sends one every second), which rollouts then wait for. Entries that
# arrive after it ended are the next tick's, or drained by the rollout that is waiting for them.
BEAT_BLOCK_MS = 50


@shared_task(name="trove.proxy.ingest", ignore_result=True, soft_time_limit=90, time_limit=120)
def ingest_proxy_records(max_seconds: float = INGEST_MAX_S) -> dict:
    if not settings.REDIS_URL:
        return {"skipped": "embedded: the proxy writes to the database itself"}
    client = redis_client(settings.REDIS_URL)
    try:
        lock = client.lock(f"{proxy_stream()}:ingest-lock", timeout=max_seconds + 60, blocking=False)
        if not lock.acquire():
            return {"skipped": "another ingest is running"}
        try:
            report: dict = ingest_stream(consumer=execution_id("ingest"), max_seconds=max_seconds,
                                         block_ms=BEAT_BLOCK_MS)
            report["pruned_consumers"] = prune_abandoned_consumers()
            return report
        finally:
            lock.release()
    except redis.RedisError as exc:  # beat tries again in a second; the records wait in the stream
        log.warning("proxy record ingest: Redis unavailable (%s)", exc)
        return {"error": str(exc)}
