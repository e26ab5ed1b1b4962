"""The Redis keys a test run makes, named so that the run can find and remove its own.

Every Celery queue a test routes messages to is named by `unique_queue` (`trove-test-<run>-...`) and every
Redis stream a test names itself by `unique_stream` (`trove:test:<run>:...`), where <run> is this pytest
process's tag. The proxy's own stream is named after the test database, which belongs to this run alone.
So the session check in tests/conftest.py looks only at this run's keys: never at those of another run
sharing the Redis db, nor at the kombu keys a worker outside the tests keeps there.
"""

from __future__ import annotations

import json
import os
import uuid

import redis

RUN_TAG = f"{os.getpid():x}{uuid.uuid4().hex[:4]}"
QUEUE_PREFIX = f"trove-test-{RUN_TAG}-"
STREAM_PREFIX = f"trove:test:{RUN_TAG}:"
# The tables kombu keeps of the workers' control queues (`<worker name>.celery.pidbox`): a test worker is
# named after its queue, so its member there carries the run's tag.
PIDBOX_TABLES = ("_kombu.binding.celery.pidbox", "_kombu.binding_permanent.celery.pidbox")
BINDING_DEADLINES = "_kombu.binding_deadlines"
# Messages a worker took and had not acknowledged (kombu's `unacked` hash, delivery tag -> [message, exchange,
# routing key], and its `unacked_index` zset): a worker killed in a test leaves its message there.
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def unique_queue(kind: str = "") -> str:
    """A Celery queue name of this run's own (`kind` says what it is for, in `redis-cli --scan`)."""
    return f"{QUEUE_PREFIX}{kind + '-' if kind else ''}{uuid.uuid4().hex[:8]}"


def unique_stream(kind: str) -> str:
    return f"{STREAM_PREFIX}{kind}:{uuid.uuid4().hex}"


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps `queue`'s messages in: one per priority step (kombu's default steps and
    separator, `Channel.priority_steps` and `sep`)."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in (3, 6, 9)]


def proxy_stream_keys(stream: str) -> list[str]:
    """The keys the proxy's ingest makes for `stream` (webapp/proxy: the stream, its dead letter, its lock)."""
    return [stream, f"{stream}:dead", f"{stream}:ingest-lock"]


def forget_queue(client: redis.Redis, queue: str) -> None:
    """Remove what kombu keeps in Redis for `queue`: its message lists (one per priority), its binding
    tables, the control-queue entries of workers named after it, and its messages a worker took without
    acknowledging them; then the control table's deadline, once no worker's entry is left in it (kombu's
    sweep would remove it later, with nothing to guard)."""
    keys = list(client.scan_iter(match=f"*{queue}*", count=1000))
    if keys:
        client.delete(*keys)
    for table in PIDBOX_TABLES:
        members = list(client.sscan_iter(table, match=f"*{queue}*"))
        if members:
            client.srem(table, *members)
    if not client.exists(*PIDBOX_TABLES):
        client.zrem(BINDING_DEADLINES, "celery.pidbox")
    _forget_unacked(client, lambda routing_key: routing_key == queue)


def _unacked_for(client: redis.Redis, wanted) -> list[str]:
    """Delivery tags of the unacknowledged messages whose routing key `wanted` accepts."""
    tags = []
    for tag, entry in client.hscan_iter(UNACKED):
        try:
            routing_key = json.loads(entry)[2]
        except (ValueError, IndexError, TypeError):
            continue
        if wanted(routing_key):
            tags.append(tag.decode())
    return tags


def _forget_unacked(client: redis.Redis, wanted) -> None:
    tags = _unacked_for(client, wanted)
    if tags:
        client.hdel(UNACKED, *tags)
        client.zrem(UNACKED_INDEX, *tags)


def forget_stream(client: redis.Redis, stream: str) -> list[dict]:
    """Delete `stream` and its companions; return the records that were in its dead letter (each a dict of
    its fields, `reason` and `error` among them) so that the caller can fail on them."""
    dead = [_decoded(fields) for _, fields in client.xrange(f"{stream}:dead")]
    client.delete(*proxy_stream_keys(stream))
    # The proxy's per-attempt admission counts and closed gates (webapp/proxy/admission.py), named after it.
    gates = [*client.scan_iter(match=f"{stream}:admitted:*", count=1000),
             *client.scan_iter(match=f"{stream}:closed:*", count=1000)]
    if gates:
        client.delete(*gates)
    return dead


def describe_dead_letters(stream: str, dead: list[dict]) -> str:
    reasons = "; ".join(f"{d.get('reason', '?')}: {d.get('error', '')[:200]}" for d in dead[:10])
    return f"the proxy set aside {len(dead)} record(s) in the dead letter {stream}:dead ({reasons})"


def leftover_keys(client: redis.Redis, *, proxy_stream: str | None) -> list[str]:
    """This run's keys still in Redis: its queues' and streams', the proxy stream's, its workers' entries in
    the control tables and its queues' unacknowledged messages (those two listed as `table -> member`)."""
    keys = {k.decode() for pattern in (f"*{QUEUE_PREFIX}*", f"{STREAM_PREFIX}*")
            for k in client.scan_iter(match=pattern, count=1000)}
    if proxy_stream:
        keys.update(k for k in proxy_stream_keys(proxy_stream) if client.exists(k))
    for table in PIDBOX_TABLES:
        keys.update(f"{table} -> {m.decode()}" for m in client.sscan_iter(table, match=f"*{QUEUE_PREFIX}*"))
    keys.update(f"{UNACKED} -> {tag}" for tag in _unacked_for(client, lambda key: QUEUE_PREFIX in str(key)))
    return sorted(keys)


def remove_leftovers(client: redis.Redis, leftovers: list[str]) -> None:
    """Remove what `leftover_keys` listed (keys, and `table -> member` entries)."""
    for leftover in leftovers:
        table, arrow, member = leftover.partition(" -> ")
        if arrow and table == UNACKED:
            client.hdel(UNACKED, member)
            client.zrem(UNACKED_INDEX, member)
        elif arrow:
            client.srem(table, member)
        else:
            client.delete(table)


def _decoded(fields: dict) -> dict:
    return {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
