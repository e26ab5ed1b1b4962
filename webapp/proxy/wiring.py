"""Wires the proxy core (no Django in it) to Trove: token lookup in the database, writing call records.

`write_call_records` is the one writer of proxy records, used by the in-process sink (embedded default)
and by the Redis-stream consumer (full stack). It is idempotent by call id (steps_append skips a call id
it already stored), so a redelivered batch or a replayed spool adds nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection

from experience.services.ingest import steps_append
from webapp.proxy.records import CallRecord
from webapp.rollouts.services import resolve_api_key, rollout_by_token

TOKEN_CACHE_S = 2.0
_cache: dict[str, tuple[float, object]] = {}


def write_call_records(records: list[CallRecord]) -> None:
    close_old_connections()
    by_trajectory: dict[int, list[CallRecord]] = defaultdict(list)
    for record in records:
        by_trajectory[int(record.trajectory_id)].append(record)
    try:
        for trajectory_id, calls in by_trajectory.items():
            calls.sort(key=lambda call: call.started_at)
            steps_append(trajectory_id=trajectory_id, steps=[call.to_step_record() for call in calls])
    finally:
        # Writer and lookup threads hold no connection between batches: nothing pins the database.
        connection.close()


def _lookup(token: str):
    from webapp.proxy.app import Target

    try:
        rollout = rollout_by_token(token)
    finally:
        connection.close()
    if rollout is None or rollout.trajectory_id is None:
        return None
    return Target(
        rollout_id=str(rollout.pk),
        trajectory_id=str(rollout.trajectory_id),
        upstream_base_url=rollout.job.model_base_url,
        upstream_api_key=resolve_api_key(rollout.job.api_key_ref),
        model_override=None,
    )


_lookup_async = sync_to_async(_lookup, thread_sensitive=False)


async def resolve_token(token: str):
    """The running rollout behind a token, cached briefly: a rollout makes many calls in a row.

    A cached hit can outlive a rollout's end by TOKEN_CACHE_S; misses are not cached, so a new rollout's
    token works at once.
    """
    now = time.monotonic()
    hit = _cache.get(token)
    if hit and hit[0] > now:
        return hit[1]
    target = await _lookup_async(token)
    if target is not None:
        _cache[token] = (now + TOKEN_CACHE_S, target)
    else:
        _cache.pop(token, None)
    return target


def make_trove_proxy_app(*, sink=None, **app_options):
    """The proxy app wired to this Trove: tokens from the database, records into the store.

    Returns (app, sink). The default sink writes in batches from a background thread of this process.
    `app_options` go to `make_proxy_app` (upstream_timeout, connector_limit, ...).
    """
    from webapp.proxy.app import make_proxy_app
    from webapp.proxy.recorder import InProcessSink

    sink = sink or InProcessSink(write_call_records)
    return make_proxy_app(resolve=resolve_token, sink=sink, **app_options), sink
