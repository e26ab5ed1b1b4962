"""Where the proxy's call records go, off the request path.

The proxy's handlers call `sink.put(record)`, which only appends to an in-memory queue; a background thread
does the I/O in batches. Two sinks:

- `InProcessSink` hands batches to a `write_batch(list[CallRecord])` callback in this process (the embedded
  default: the web process's database writer).
- `RedisStreamSink` XADDs each record to a Redis stream for `consume_stream` workers; when Redis is down it
  spools to local fsync'd files (`spool.py`) and re-sends them once Redis answers again.

Delivery is at least once everywhere (a retried XADD, a replayed spool segment, a redelivered stream
entry). The contract for every `write_batch` is therefore: idempotent by `call_id` — a record whose
call id is already stored is ignored, and a duplicate inside one batch keeps the first.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from webapp.proxy.records import CallRecord
from webapp.proxy.spool import Spool, drain_spool, spooled_segments

log = logging.getLogger(__name__)

STREAM = "trove:proxy:calls"
# Records per stream entry, at most. A consumer reads up to batch_size // ENTRY_READ_DIVISOR entries at a
# time, so its write batches stay within a few hundred to a thousand records whatever the entries hold.
ENTRY_MAX_RECORDS = 32
ENTRY_READ_DIVISOR = 8
WriteBatch = Callable[[list[CallRecord]], None]


class RecordSink(Protocol):
    def put(self, record: CallRecord) -> None:
        """Queue the record; never blocks on I/O (called from the event loop)."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record put so far has been handled; False on timeout."""

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the background thread."""


class _Marker:
    """A queue item that is not a record: a flush point or the stop signal."""

    def __init__(self, *, stop: bool = False) -> None:
        self.stop = stop
        self.reached = threading.Event()


class _BatchingSink:
    """A buffer drained by one daemon thread that hands records to `_write` in batches.

    `put` only appends to a deque: it never wakes the thread. The thread looks every `linger_s` and takes
    what has gathered. Waking it per record (a blocking queue) cost the event loop a GIL hand-off per
    call, which under load was a large share of the proxy's own CPU; polling costs a wake-up per
    `linger_s` whether busy or idle. flush() and close() do wake it, through their marker.
    """

    def __init__(self, *, batch_size: int, linger_s: float, name: str) -> None:
        self._items: collections.deque[CallRecord | _Marker] = collections.deque()
        self._wake = threading.Event()
        self._batch_size = batch_size
        self._poll_s = linger_s if linger_s > 0 else 0.005
        self._idle_timeout = 1.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, record: CallRecord) -> None:
        if self._closed:
            raise RuntimeError("sink is closed")
        self._items.append(record)

    def flush(self, timeout: float | None = None) -> bool:
        marker = _Marker()
        self._items.append(marker)
        self._wake.set()
        return marker.reached.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        marker = _Marker(stop=True)
        self._items.append(marker)
        self._wake.set()
        marker.reached.wait(timeout)
        self._thread.join(timeout)

    def pending(self) -> int:
        """Records and markers not yet taken by the writer thread (approximate)."""
        return len(self._items)

    def _write(self, records: list[CallRecord]) -> None:
        raise NotImplementedError

    def _on_idle(self) -> None:
        """Called when nothing arrived for a while; subclasses retry deferred work here."""

    def _on_stop(self) -> None:
        """Called on the writer thread after the last batch, before close() returns."""

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if not self._items:
                if time.monotonic() - idle_since >= self._idle_timeout:
                    self._guarded(self._on_idle)
                    idle_since = time.monotonic()
                continue
            while self._items:  # a backlog goes out batch after batch, without waiting between them
                batch, marker = self._collect()
                if batch:
                    self._guarded(self._write, batch)
                if marker is not None:
                    if marker.stop:
                        self._guarded(self._on_stop)
                        marker.reached.set()
                        return
                    marker.reached.set()
            idle_since = time.monotonic()

    def _collect(self) -> tuple[list[CallRecord], _Marker | None]:
        # A marker ends the batch: everything before it must be written before it is reached.
        batch: list[CallRecord] = []
        while self._items and len(batch) < self._batch_size:
            item = self._items.popleft()
            if isinstance(item, _Marker):
                return batch, item
            batch.append(item)
        return batch, None

    @staticmethod
    def _guarded(step: Callable[..., None], *args: Any) -> None:
        try:
            step(*args)
        except Exception:  # the writer thread must outlive any one failure
            log.exception("call record sink: unexpected error")


class InProcessSink(_BatchingSink):
    """Hands batches to `write_batch` on a background thread.

    A failing batch is retried `retries` times with backoff; then, when `spool_dir` is set, spooled to disk
    and re-sent with `write_batch` once the thread is idle and `drain_interval_s` has passed (segments left
    by an earlier process in the directory too), else logged and counted in `failed`. flush() returns once
    every earlier record was written, spooled or given up on.
    """

    def __init__(
        self,
        write_batch: WriteBatch,
        *,
        batch_size: int = 256,
        retries: int = 3,
        retry_backoff_s: float = 0.2,
        spool_dir: str | os.PathLike[str] | None = None,
        linger_s: float = 0.02,
        drain_interval_s: float = 5.0,
    ) -> None:
        self._write_batch = write_batch
        self._retries = retries
        self._retry_backoff_s = retry_backoff_s
        self.spool_dir = spool_dir
        self._spool = Spool(spool_dir) if spool_dir is not None else None
        self._spool_dirty = spool_dir is not None and bool(spooled_segments(spool_dir))
        self._drain_interval_s = drain_interval_s
        self._next_drain = 0.0
        self.written = 0
        self.spooled = 0
        self.failed = 0
        super().__init__(batch_size=batch_size, linger_s=linger_s, name="trove-proxy-sink")

    def drain_spool(self) -> int:
        """Re-send spooled records with `write_batch` now; returns how many were sent. Raises what the
        writer raises (what is left stays spooled)."""
        if self._spool is None or self.spool_dir is None:
            return 0
        self._spool.seal()
        try:
            return drain_spool(directory=self.spool_dir, send_batch=self._write_batch).sent
        finally:
            self._spool_dirty = bool(spooled_segments(self.spool_dir))

    def _write(self, records: list[CallRecord]) -> None:
        for attempt in range(self._retries + 1):
            try:
                self._write_batch(records)
            except Exception:
                log.exception("call record writer failed (attempt %d)", attempt + 1)
                time.sleep(self._retry_backoff_s * (2**attempt))
            else:
                self.written += len(records)
                return
        self._give_up(records)

    def _give_up(self, records: list[CallRecord]) -> None:
        if self._spool is None:
            self.failed += len(records)
            log.error("dropped %d call record(s): writer kept failing and no spool is set", len(records))
            return
        self._spool.append(records)
        self.spooled += len(records)
        self._spool_dirty = True

    def _on_idle(self) -> None:
        # Only when idle and throttled: the writer was failing a moment ago, and new records go first.
        now = time.monotonic()
        if not self._spool_dirty or now < self._next_drain:
            return
        self._next_drain = now + self._drain_interval_s
        try:
            sent = self.drain_spool()
        except Exception as exc:
            log.warning("call record writer still failing for the spool drain (%s)", exc)
            return
        if sent:
            log.info("re-wrote %d spooled call record(s)", sent)

    def _on_stop(self) -> None:
        if self._spool is not None:
            self._spool.close()


class RedisStreamSink(_BatchingSink):
    """XADDs each record (field `record`, the record's JSON) to a Redis stream from a background thread.

    When Redis errors, the batch goes to the spool in `spool_dir` and Redis is left alone for
    `retry_interval_s` (new batches spool straight away meanwhile). Once Redis answers again, the spool —
    this process's segments and those of dead processes sharing the directory — is re-sent, automatically,
    or explicitly with `drain_spool()`. A `client` passed in should fail fast: redis-py's default retry
    backoff holds the writer for seconds per batch while Redis is down.
    """

    def __init__(
        self,
        *,
        spool_dir: str | os.PathLike[str],
        url: str | None = None,
        client: redis.Redis | None = None,
        stream: str = STREAM,
        batch_size: int = 256,
        retry_interval_s: float = 5.0,
        linger_s: float = 0.02,
    ) -> None:
        if client is None:
            if url is None:
                raise ValueError("RedisStreamSink needs a url or a client")
            # Fail fast: a Redis that is down costs a spool write, not the client's retry backoff.
            client = redis.Redis.from_url(
                url, socket_connect_timeout=2.0, socket_timeout=5.0, retry=Retry(NoBackoff(), 1)
            )
        self._send = redis_stream_sender(client, stream=stream)
        self.stream = stream
        self.spool_dir = spool_dir
        self._spool = Spool(spool_dir)
        self._retry_interval_s = retry_interval_s
        self._down_until = 0.0
        self._next_drain = 0.0
        # Segments left by an earlier process are re-sent on the first chance.
        self._spool_dirty = bool(spooled_segments(spool_dir))
        self.sent = 0
        self.spooled = 0
        super().__init__(batch_size=batch_size, linger_s=linger_s, name="trove-proxy-redis-sink")

    def drain_spool(self) -> int:
        """Re-send spooled records to the stream now; returns how many were sent."""
        self._spool.seal()
        result = drain_spool(directory=self.spool_dir, send_batch=self._send)
        self._spool_dirty = bool(spooled_segments(self.spool_dir))
        return result.sent

    def _write(self, records: list[CallRecord]) -> None:
        if time.monotonic() < self._down_until:
            self._spool_records(records)
            return
        try:
            self._send(records)
        except redis.RedisError as exc:
            log.warning("Redis unavailable (%s); spooling %d call record(s)", exc, len(records))
            self._down_until = time.monotonic() + self._retry_interval_s
            self._spool_records(records)
            return
        self.sent += len(records)
        self._maybe_drain()

    def _on_idle(self) -> None:
        self._maybe_drain()

    def _maybe_drain(self) -> None:
        # Throttled: a segment another live process still holds keeps the spool dirty.
        now = time.monotonic()
        if self._spool_dirty and now >= max(self._down_until, self._next_drain):
            self._next_drain = now + self._retry_interval_s
            self._try_drain()

    def _on_stop(self) -> None:
        self._spool.close()

    def _try_drain(self) -> None:
        try:
            sent = self.drain_spool()
        except redis.RedisError as exc:
            log.warning("Redis still unavailable for the spool drain (%s)", exc)
            self._down_until = time.monotonic() + self._retry_interval_s
            return
        if sent:
            log.info("re-sent %d spooled call record(s) to %s", sent, self.stream)

    def _spool_records(self, records: list[CallRecord]) -> None:
        self._spool.append(records)
        self.spooled += len(records)
        self._spool_dirty = True


def redis_stream_sender(client: redis.Redis, *, stream: str = STREAM) -> WriteBatch:
    """A `send_batch` (the sink's, and for `spool.drain_spool` run from elsewhere) that XADDs the records
    to the stream in one round trip: one entry per ENTRY_MAX_RECORDS records, in order, field `records`
    holding their JSON lines. An entry per record cost the proxy (and Redis) a command each: several
    times the CPU of one command for the lot. Consumers also read the one-record `record` field."""

    def send(records: list[CallRecord]) -> None:
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(records), ENTRY_MAX_RECORDS):
            lines = b"\n".join(record.to_json() for record in records[start : start + ENTRY_MAX_RECORDS])
            pipe.xadd(stream, {"records": lines})
        pipe.execute()

    return send


def consume_stream(
    redis_client: redis.Redis,
    write_batch: WriteBatch,
    *,
    group: str,
    consumer: str,
    batch_size: int = 256,
    block_ms: int = 1000,
    stream: str = STREAM,
    claim_idle_ms: int = 60_000,
    stop: threading.Event | None = None,
    until_idle: bool = False,
    retry_backoff_s: float = 1.0,
    max_seconds: float | None = None,
) -> int:
    """Read call records from the stream with a consumer group and hand them to `write_batch`.

    Entries are XACKed (and XDELed: the stream is a work queue, not a log) only after `write_batch`
    returned, so a crash between the two redelivers them: `write_batch` must be idempotent by call id.
    Entries pending for this consumer name (an earlier run of it) are taken first; entries pending longer
    than `claim_idle_ms` for any consumer (a dead one) are taken over with XAUTOCLAIM. When `write_batch`
    raises, nothing is acked and the batch is retried after `retry_backoff_s`. Entries that do not decode
    go to `<stream>:dead` and are acked. Runs until `stop` is set, `max_seconds` have passed (checked
    between batches) or, with `until_idle`, until a read finds nothing to do. Returns how many records
    were written.
    """
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    consumer_state = _Consumer(redis_client, write_batch, stream, group, consumer, batch_size)
    consumer_state.ensure_group()
    reader = _EntryReader(consumer_state, block_ms=block_ms, claim_idle_ms=claim_idle_ms)
    while (stop is None or not stop.is_set()) and (deadline is None or time.monotonic() < deadline):
        entries = reader.next_entries()
        if entries is None:
            if until_idle:
                break
            continue
        if not consumer_state.handle(entries):
            reader.retry_own_pending()
            pause = retry_backoff_s if deadline is None else min(retry_backoff_s, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
    return consumer_state.written


Entry = tuple[bytes, dict[bytes, bytes] | None]


class _Consumer:
    def __init__(
        self,
        client: redis.Redis,
        write_batch: WriteBatch,
        stream: str,
        group: str,
        name: str,
        batch_size: int,
    ) -> None:
        self.client = client
        self.write_batch = write_batch
        self.stream = stream
        self.group = group
        self.name = name
        self.batch_size = batch_size
        self.entries_per_read = max(1, batch_size // ENTRY_READ_DIVISOR)
        self.written = 0

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, last_id: str, block_ms: int | None) -> list[Entry]:
        reply: Any = self.client.xreadgroup(
            self.group, self.name, {self.stream: last_id}, count=self.entries_per_read, block=block_ms
        )
        return list(reply[0][1]) if reply else []

    def autoclaim(self, cursor: str, min_idle_ms: int) -> tuple[str, list[Entry]]:
        reply: Any = self.client.xautoclaim(
            self.stream, self.group, self.name, min_idle_ms, start_id=cursor, count=self.entries_per_read
        )
        next_cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return next_cursor, list(reply[1])

    def handle(self, entries: list[Entry]) -> bool:
        """Write the decodable records, then ack all; False (nothing acked) when the write failed."""
        records, dead = _decode_entries(entries)
        if records:
            try:
                self.write_batch(_unique_by_call_id(records))
            except Exception:
                log.exception("call record writer failed; %d entr(ies) stay pending", len(entries))
                return False
        pipe = self.client.pipeline(transaction=False)
        for entry_id, fields in dead:
            dead_fields: dict[Any, Any] = {"entry_id": entry_id, **(fields or {})}
            pipe.xadd(f"{self.stream}:dead", dead_fields)
        ids = [entry_id for entry_id, _ in entries]
        pipe.xack(self.stream, self.group, *ids)
        pipe.xdel(self.stream, *ids)
        pipe.execute()
        self.written += len(records)
        return True


class _EntryReader:
    """Chooses what to read next: own pending entries, then abandoned ones, then new ones."""

    def __init__(self, consumer: _Consumer, *, block_ms: int, claim_idle_ms: int) -> None:
        self._consumer = consumer
        self._block_ms = block_ms
        self._claim_idle_ms = claim_idle_ms
        self._own_pending = True
        self._claim_cursor = "0-0"
        self._next_claim = 0.0

    def retry_own_pending(self) -> None:
        self._own_pending = True

    def next_entries(self) -> list[Entry] | None:
        """Entries to handle, or None when a (blocking) read for new entries found nothing."""
        if self._own_pending:
            entries = self._consumer.read("0", None)
            if entries:
                return entries
            self._own_pending = False
        if time.monotonic() >= self._next_claim:
            self._claim_cursor, entries = self._consumer.autoclaim(self._claim_cursor, self._claim_idle_ms)
            if self._claim_cursor == "0-0":
                self._next_claim = time.monotonic() + max(self._claim_idle_ms / 1000.0, 1.0)
            if entries:
                return entries
        entries = self._consumer.read(">", self._block_ms)
        return entries or None


def _decode_entries(entries: list[Entry]) -> tuple[list[CallRecord], list[Entry]]:
    """The records in the entries, in order, and what could not be decoded (as entries holding one
    `record` each, for the dead-letter stream: one bad line of a batch entry does not take the rest)."""
    records: list[CallRecord] = []
    dead: list[Entry] = []
    for entry_id, fields in entries:
        if fields is None:
            continue  # deleted before it was claimed (Redis < 7 still lists it): only the ack is due
        if b"records" not in fields and b"record" not in fields:
            log.error("entry %r holds no call record: moved to the dead-letter stream", entry_id)
            dead.append((entry_id, fields))
            continue
        lines = fields[b"records"].split(b"\n") if b"records" in fields else [fields[b"record"]]
        for line in lines:
            try:
                records.append(CallRecord.from_json(line))
            except (KeyError, ValueError, TypeError):
                log.error("undecodable call record in entry %r moved to the dead-letter stream", entry_id)
                dead.append((entry_id, {b"record": line}))
    return records, dead


def _unique_by_call_id(records: list[CallRecord]) -> list[CallRecord]:
    seen: set[str] = set()
    unique = []
    for record in records:
        if record.call_id not in seen:
            seen.add(record.call_id)
            unique.append(record)
    return unique
