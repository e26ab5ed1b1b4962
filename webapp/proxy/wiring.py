"""Wires the proxy core (no Django in it) to Trove: rollout tokens from the database, records into the store.

The record path:
- embedded default (no REDIS_URL): the proxy's `InProcessSink` hands batches to `write_call_records` on
  a thread of the proxy's process. A batch the database keeps refusing is spooled and re-written later.
- full stack (REDIS_URL): the proxy's `RedisStreamSink` XADDs each record to this Trove's stream; while
  Redis is down it spools to local fsync'd files and re-sends them once Redis answers. The Celery task
  `trove.proxy.ingest` (on beat every second) and `ingest_pending_records` (called by a rollout runner
  waiting for its calls) consume the stream in batches into `write_call_records`.

Every hop is at least once; the writer is idempotent by call id, so nothing is stored twice, and a record
that can never be stored goes to a dead letter instead of blocking the rest (see writer.py).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from functools import cache
from typing import Any

import redis
from aiohttp import web
from django.conf import settings
from django.db import connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from webapp.proxy.admission import GateCount, RedisAdmissions, close_and_count, local_admissions
from webapp.proxy.app import make_proxy_app
from webapp.proxy.locations import proxy_spool_dir, proxy_stream
from webapp.proxy.recorder import InProcessSink, RecordSink, RedisStreamSink, consume_stream
from webapp.proxy.records import CallRecord
from webapp.proxy.tokens import TokenResolver
from webapp.proxy.writer import WriteOutcome, stream_dead_letter, write_call_records

__all__ = ["ingest_pending_records", "ingest_stream", "make_trove_proxy_app", "write_call_records"]

log = logging.getLogger("trove.proxy")

INGEST_GROUP = "trove-ingest"
# A consumer that has held nothing for this long belongs to an execution that ended without cleaning up
# (a killed worker): its name is removed. A live consumer talks to Redis at least every block_ms.
ABANDONED_CONSUMER_MS = 10 * 60 * 1000
TOKEN_RESOLVER = web.AppKey("trove_token_resolver", TokenResolver)


def make_trove_proxy_app(
    *, sink: RecordSink | None = None, resolver: TokenResolver | None = None, **app_options: Any
):
    """The proxy app wired to this Trove: tokens checked in the database, records into the store.

    Returns (app, sink). Without `sink`: a `RedisStreamSink` on the full stack (REDIS_URL set), else an
    `InProcessSink` writing straight to the database. `app_options` go to `make_proxy_app`
    (upstream_timeout, connector_limit, ...). The caller closes the sink after the app has stopped; the
    app closes its resolver's connection on cleanup.
    """
    resolver = resolver or TokenResolver()
    sink = sink or default_sink()
    # Each call is counted before it is forwarded, so a rollout runner knows exactly how many records to wait
    # for once its harness has exited, and the job's step budget holds (admission.py): in Redis on the full
    # stack, in this process in the embedded default.
    admissions = RedisAdmissions(settings.REDIS_URL, prefix=proxy_stream()) if settings.REDIS_URL else None
    app_options.setdefault("admit", admissions.admit if admissions else local_admissions.admit)
    if admissions is not None and app_options["admit"] == admissions.admit:
        # A known token's call is counted while its token is checked: the two round trips overlap. In this
        # process (embedded) the count costs no round trip, so there is nothing to overlap.
        app_options.setdefault("known_budget", resolver.known_budget)
        app_options.setdefault("unadmit", admissions.unadmit)
    app = make_proxy_app(resolve=resolver.resolve, sink=sink, **app_options)
    app[TOKEN_RESOLVER] = resolver
    app.on_cleanup.append(resolver.aclose)
    if admissions is not None:
        app.on_cleanup.append(admissions.aclose)
    elif app_options["admit"] == local_admissions.admit:
        app.on_startup.append(local_admissions.serve)
        app.on_cleanup.append(local_admissions.unserve)
    return app, sink


def close_and_count_admitted(token: str) -> GateCount | None:
    """Close the rollout attempt's gate (its token admits no more calls) and return how many distinct calls
    the proxy admitted for it and how many its step budget refused. Full stack: in Redis (raises
    redis.RedisError when Redis cannot answer); embedded: in this process, None when no proxy runs here."""
    if not settings.REDIS_URL:
        return local_admissions.close_and_count(token)
    return close_and_count(redis_client(settings.REDIS_URL), token, prefix=proxy_stream())


def default_sink() -> RecordSink:
    if settings.REDIS_URL:
        return RedisStreamSink(url=settings.REDIS_URL, spool_dir=proxy_spool_dir(), stream=proxy_stream())
    return database_sink()


def database_sink() -> InProcessSink:
    """The embedded default's sink: batches written to the database from a thread of this process."""
    return InProcessSink(_write_on_sink_thread, spool_dir=proxy_spool_dir())


def _write_on_sink_thread(records: list[CallRecord]) -> None:
    try:
        write_call_records(records)
    finally:
        # The sink's thread holds no connection between batches: an idle proxy pins nothing.
        connection.close()


# --- the stream ingest (full stack) ---------------------------------------------------------------------


def ingest_pending_records(timeout_s: float) -> int:
    """Store the records waiting in the stream, for at most `timeout_s`: what a rollout runner calls while
    it waits for its own calls to land, so it does not depend on beat's ingest having a free worker.
    Returns how many records were handed to the writer. A no-op (0) in the embedded default, and when
    Redis cannot be reached (the proxy spools meanwhile; the calls land once it is back).
    """
    if not settings.REDIS_URL or timeout_s <= 0:
        return 0
    block_ms = max(1, min(100, int(timeout_s * 1000)))  # a record in flight arrives within the sink's linger
    try:
        return ingest_stream(consumer=consumer_name("runner"), max_seconds=timeout_s, block_ms=block_ms)["records"]
    except redis.RedisError as exc:
        log.warning("proxy record ingest: Redis unavailable (%s)", exc)
        return 0


# Entries a consumer read but has not acknowledged for this long are taken over by another consumer: the
# reader died (a worker killed mid-drain: rollout runners drain the stream while their harnesses run) or is
# stuck. Short, because writes are idempotent by call id: taking over from a consumer that was only slow
# costs a repeated write, never a duplicate step, while waiting longer delays a dead worker's calls.
PENDING_TAKEOVER_MS = 15_000


def ingest_stream(*, consumer: str, max_seconds: float, block_ms: int = 1000) -> dict[str, int]:
    """Consume this Trove's stream into the store until a read finds nothing (within `block_ms`) or
    `max_seconds` have passed; then drop the consumer's name from the group if it holds nothing.

    Several may run at once (a consumer group shares the entries out). A batch that fails transiently stays
    pending under `consumer` and is taken over by another consumer once idle for PENDING_TAKEOVER_MS. Returns counts:
    `records` handed to the writer, `stored` steps created, `dead_lettered` records set aside.
    """
    if not settings.REDIS_URL:
        return {"records": 0, "stored": 0, "dead_lettered": 0}
    client, stream = redis_client(settings.REDIS_URL), proxy_stream()
    outcome = WriteOutcome()
    dead_letter = stream_dead_letter(client, stream=stream)

    def write(records: list[CallRecord]) -> None:
        outcome.add(write_call_records(records, dead_letter=dead_letter))

    records = consume_stream(client, write, group=INGEST_GROUP, consumer=consumer, stream=stream, until_idle=True,
                             max_seconds=max_seconds, block_ms=block_ms, claim_idle_ms=PENDING_TAKEOVER_MS,
                             retry_backoff_s=0.5)
    _forget_consumer(client, stream, consumer)
    return {"records": records, "stored": outcome.stored, "dead_lettered": outcome.dead_lettered}


def prune_abandoned_consumers() -> int:
    """Remove consumer names that hold nothing and have been silent for ABANDONED_CONSUMER_MS (their
    executions were killed before they could remove themselves). Returns how many were removed."""
    client, stream = redis_client(settings.REDIS_URL), proxy_stream()
    try:
        consumers = client.xinfo_consumers(stream, INGEST_GROUP)
    except redis.ResponseError:
        return 0  # no stream or no group yet
    removed = 0
    for info in consumers:
        if info["pending"] == 0 and info["idle"] >= ABANDONED_CONSUMER_MS:
            client.xgroup_delconsumer(stream, INGEST_GROUP, info["name"])
            removed += 1
    return removed


def _forget_consumer(client: redis.Redis, stream: str, consumer: str) -> None:
    # One consumer name per execution: without this the group's consumer list grows by one a second.
    # Only when it holds nothing: deleting a consumer drops its pending entries, which would lose them.
    if not client.xpending_range(stream, INGEST_GROUP, min="-", max="+", count=1, consumername=consumer):
        client.xgroup_delconsumer(stream, INGEST_GROUP, consumer)


def consumer_name(role: str) -> str:
    """A consumer name for one execution: host, process and a nonce."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@cache
def redis_client(url: str) -> redis.Redis:
    # Fails fast while Redis is down (no backoff loop); the timeout outlasts the consumer's blocking read.
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=10.0, retry=Retry(NoBackoff(), 1),
                                health_check_interval=30)
