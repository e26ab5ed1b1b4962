"""Sinks and the stream consumer, on a real Redis at 127.0.0.1:6379 (one fresh stream per test)."""

from __future__ import annotations

import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.webapp.proxy.harness import closed_port
from tests.webapp.proxy.test_proxy_spool import make_record
from webapp.proxy.recorder import (
    ENTRY_MAX_RECORDS,
    InProcessSink,
    RedisStreamSink,
    consume_stream,
    redis_stream_sender,
)
from webapp.proxy.records import CallRecord
from webapp.proxy.spool import drain_spool, spooled_segments


def _collector() -> tuple[list[CallRecord], object]:
    written: list[CallRecord] = []
    return written, written.extend


def test_the_in_process_sink_writes_everything_in_batches_before_flush_returns():
    batches: list[list[str]] = []
    sink = InProcessSink(lambda batch: batches.append([r.call_id for r in batch]), batch_size=4)

    for i in range(10):
        sink.put(make_record(f"c{i}"))
    assert sink.flush(5)

    assert [c for batch in batches for c in batch] == [f"c{i}" for i in range(10)]
    assert all(len(batch) <= 4 for batch in batches)
    sink.close()


def test_the_in_process_sink_retries_a_failing_writer():
    attempts: list[int] = []
    written: list[CallRecord] = []

    def flaky(batch):
        attempts.append(len(batch))
        if len(attempts) < 3:
            raise RuntimeError("database restarting")
        written.extend(batch)

    sink = InProcessSink(flaky, retries=3, retry_backoff_s=0.01)
    sink.put(make_record("x"))
    sink.close(5)

    assert [r.call_id for r in written] == ["x"] and sink.written == 1


def test_the_in_process_sink_spools_what_its_writer_keeps_refusing(tmp_path):
    def broken(batch):
        raise RuntimeError("database gone")

    sink = InProcessSink(broken, retries=1, retry_backoff_s=0.01, spool_dir=tmp_path)
    sink.put(make_record("kept"))
    sink.close(5)
    written, write = _collector()

    drain_spool(directory=tmp_path, send_batch=write)

    assert sink.spooled == 1 and [r.call_id for r in written] == ["kept"]


def test_records_go_through_the_redis_stream_and_are_acked(tmp_path, redis_client, stream_name):
    sink = RedisStreamSink(client=redis_client, stream=stream_name, spool_dir=tmp_path)
    for i in range(25):
        sink.put(make_record(f"r{i}"))
    sink.close(5)
    written, write = _collector()

    count = consume_stream(
        redis_client,
        write,
        stream=stream_name,
        group="writers",
        consumer="w1",
        batch_size=10,
        block_ms=100,
        until_idle=True,
    )

    assert count == 25 and sorted(r.call_id for r in written) == sorted(f"r{i}" for i in range(25))
    assert redis_client.xpending(stream_name, "writers")["pending"] == 0
    assert redis_client.xlen(stream_name) == 0  # acked entries are deleted: the stream is a work queue
    assert sink.sent == 25 and sink.spooled == 0 and spooled_segments(tmp_path) == []


def test_a_failed_write_leaves_entries_pending_and_they_are_retried(redis_client, stream_name):
    send = redis_stream_sender(redis_client, stream=stream_name)
    send([make_record("a"), make_record("b")])
    calls: list[list[str]] = []

    def fail_once(batch):
        calls.append([r.call_id for r in batch])
        if len(calls) == 1:
            raise RuntimeError("database hiccup")

    count = consume_stream(
        redis_client,
        fail_once,
        stream=stream_name,
        group="writers",
        consumer="w1",
        block_ms=100,
        until_idle=True,
        retry_backoff_s=0.01,
    )

    assert calls == [["a", "b"], ["a", "b"]] and count == 2
    assert redis_client.xpending(stream_name, "writers")["pending"] == 0


def test_entries_of_a_dead_consumer_are_claimed(redis_client, stream_name):
    send = redis_stream_sender(redis_client, stream=stream_name)
    send([make_record("orphan-1"), make_record("orphan-2")])
    redis_client.xgroup_create(stream_name, "writers", id="0")
    # A consumer that read them and died before acking.
    redis_client.xreadgroup("writers", "dead", {stream_name: ">"}, count=10)
    written, write = _collector()

    consume_stream(
        redis_client,
        write,
        stream=stream_name,
        group="writers",
        consumer="alive",
        claim_idle_ms=0,
        block_ms=100,
        until_idle=True,
    )

    assert sorted(r.call_id for r in written) == ["orphan-1", "orphan-2"]
    assert redis_client.xpending(stream_name, "writers")["pending"] == 0


def test_a_duplicate_call_id_in_one_batch_reaches_the_writer_once(redis_client, stream_name):
    # Across batches a duplicate does reach the writer, whose contract is to ignore a known call id.
    send = redis_stream_sender(redis_client, stream=stream_name)
    send([make_record("same"), make_record("same"), make_record("other")])
    batches: list[list[str]] = []

    consume_stream(
        redis_client,
        lambda b: batches.append([r.call_id for r in b]),
        stream=stream_name,
        group="writers",
        consumer="w1",
        block_ms=100,
        until_idle=True,
    )

    assert batches == [["same", "other"]]


def test_an_undecodable_entry_goes_to_the_dead_letter_stream(redis_client, stream_name):
    redis_client.xadd(stream_name, {"record": b"{broken"})
    redis_stream_sender(redis_client, stream=stream_name)([make_record("fine")])
    written, write = _collector()

    consume_stream(
        redis_client, write, stream=stream_name, group="writers", consumer="w1", block_ms=100, until_idle=True
    )

    assert [r.call_id for r in written] == ["fine"]
    [(_, fields)] = redis_client.xrange(f"{stream_name}:dead")
    assert fields[b"record"] == b"{broken"
    assert redis_client.xpending(stream_name, "writers")["pending"] == 0


def test_with_redis_down_records_are_spooled_then_drained_and_consumed_once(
    tmp_path, redis_client, stream_name
):
    down = redis.Redis(host="127.0.0.1", port=closed_port(), retry=Retry(NoBackoff(), 0))
    sink = RedisStreamSink(client=down, stream=stream_name, spool_dir=tmp_path)
    for i in range(30):
        sink.put(make_record(f"s{i}"))
    sink.close(10)

    assert sink.spooled == 30 and sink.sent == 0
    assert sum(len(p.read_bytes().splitlines()) for p in spooled_segments(tmp_path)) == 30
    assert redis_client.exists(stream_name) == 0

    # Redis is back (the live one): drain the spool into the stream, then consume.
    result = drain_spool(directory=tmp_path, send_batch=redis_stream_sender(redis_client, stream=stream_name))
    written, write = _collector()
    consume_stream(
        redis_client, write, stream=stream_name, group="writers", consumer="w1", block_ms=100, until_idle=True
    )

    assert result.sent == 30 and spooled_segments(tmp_path) == []
    assert sorted(r.call_id for r in written) == sorted(f"s{i}" for i in range(30))
    assert len({r.call_id for r in written}) == len(written)


def test_a_sink_resends_a_spool_left_behind_once_redis_answers(tmp_path, redis_client, stream_name):
    down = redis.Redis(host="127.0.0.1", port=closed_port(), retry=Retry(NoBackoff(), 0))
    first = RedisStreamSink(client=down, stream=stream_name, spool_dir=tmp_path)
    first.put(make_record("spooled-earlier"))
    first.close(10)

    second = RedisStreamSink(client=redis_client, stream=stream_name, spool_dir=tmp_path)
    second.put(make_record("new"))
    second.close(10)
    written, write = _collector()
    consume_stream(
        redis_client, write, stream=stream_name, group="writers", consumer="w1", block_ms=100, until_idle=True
    )

    assert sorted(r.call_id for r in written) == ["new", "spooled-earlier"]
    assert spooled_segments(tmp_path) == []


def test_a_consumer_stops_when_told(redis_client, stream_name):
    stop = threading.Event()
    written, write = _collector()
    thread = threading.Thread(
        target=consume_stream,
        args=(redis_client, write),
        kwargs=dict(stream=stream_name, group="writers", consumer="w1", block_ms=50, stop=stop),
    )
    thread.start()
    redis_stream_sender(redis_client, stream=stream_name)([make_record("live")])
    for _ in range(100):
        if written:
            break
        time.sleep(0.05)
    stop.set()
    thread.join(5)

    assert not thread.is_alive() and [r.call_id for r in written] == ["live"]


def test_the_in_process_sink_rewrites_its_spool_once_the_writer_recovers(tmp_path):
    database_up = threading.Event()
    written: list[CallRecord] = []

    def writer(batch):
        if not database_up.is_set():
            raise RuntimeError("database down")
        written.extend(batch)

    sink = InProcessSink(writer, retries=0, spool_dir=tmp_path, drain_interval_s=0.1)
    sink.put(make_record("during-the-outage"))
    assert sink.flush(5) and sink.spooled == 1 and written == []

    database_up.set()
    for _ in range(100):  # the sink re-writes its spool when it is idle
        if written:
            break
        time.sleep(0.05)
    sink.close(5)

    assert [r.call_id for r in written] == ["during-the-outage"]
    assert spooled_segments(tmp_path) == []


def test_an_in_process_sink_rewrites_a_spool_an_earlier_process_left(tmp_path):
    def broken(batch):
        raise RuntimeError("database down")

    first = InProcessSink(broken, retries=0, spool_dir=tmp_path)
    first.put(make_record("left-behind"))
    first.close(5)
    written, write = _collector()

    second = InProcessSink(write, spool_dir=tmp_path, drain_interval_s=0.1)
    for _ in range(100):
        if written:
            break
        time.sleep(0.05)
    second.close(5)

    assert [r.call_id for r in written] == ["left-behind"] and spooled_segments(tmp_path) == []


def test_a_consumer_with_a_time_cap_returns_while_its_writer_keeps_failing(redis_client, stream_name):
    redis_stream_sender(redis_client, stream=stream_name)([make_record("stuck")])

    def broken(batch):
        raise RuntimeError("database down")

    count = consume_stream(redis_client, broken, stream=stream_name, group="writers", consumer="w1",
                           block_ms=50, retry_backoff_s=0.05, max_seconds=0.5)
    pending = redis_client.xpending(stream_name, "writers")

    assert count == 0 and pending["pending"] == 1, "the entry waits for the next consumer, not lost"


def test_a_batch_goes_in_few_entries_and_every_record_comes_out_in_order(redis_client, stream_name):
    made = [f"b{i}" for i in range(2 * ENTRY_MAX_RECORDS + 5)]
    redis_stream_sender(redis_client, stream=stream_name)([make_record(call_id) for call_id in made])
    entries = redis_client.xlen(stream_name)
    batches: list[list[str]] = []

    count = consume_stream(
        redis_client,
        lambda batch: batches.append([r.call_id for r in batch]),
        stream=stream_name,
        group="writers",
        consumer="w1",
        block_ms=100,
        until_idle=True,
    )

    assert entries == 3, "one stream entry per ENTRY_MAX_RECORDS records, not one per record"
    assert [call_id for batch in batches for call_id in batch] == made and count == len(made)
    assert redis_client.xlen(stream_name) == 0


def test_the_sink_sends_what_was_put_in_order_without_being_woken_per_record(tmp_path, redis_client, stream_name):
    sink = RedisStreamSink(client=redis_client, stream=stream_name, spool_dir=tmp_path, batch_size=16,
                           linger_s=0.01)
    made = [f"o{i}" for i in range(100)]
    for call_id in made:
        sink.put(make_record(call_id))
    deadline = time.monotonic() + 10
    while sink.sent < len(made) and time.monotonic() < deadline:  # no flush: the writer's own polling
        time.sleep(0.01)
    sink.close(5)
    written, write = _collector()

    consume_stream(redis_client, write, stream=stream_name, group="writers", consumer="w1", block_ms=100,
                   until_idle=True)

    assert sink.sent == len(made) and [r.call_id for r in written] == made


def test_one_undecodable_line_of_a_batch_entry_is_set_aside_and_the_rest_written(redis_client, stream_name):
    lines = [make_record("before").to_json(), b"{broken", make_record("after").to_json()]
    redis_client.xadd(stream_name, {"records": b"\n".join(lines)})
    written, write = _collector()

    consume_stream(
        redis_client, write, stream=stream_name, group="writers", consumer="w1", block_ms=100, until_idle=True
    )

    assert [r.call_id for r in written] == ["before", "after"]
    [(_, fields)] = redis_client.xrange(f"{stream_name}:dead")
    assert fields[b"record"] == b"{broken"
    assert redis_client.xpending(stream_name, "writers")["pending"] == 0
