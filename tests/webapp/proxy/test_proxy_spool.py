"""The local spool: durable segments, drained at least once, never from under a live writer."""

from __future__ import annotations

import multiprocessing
import os
from datetime import UTC, datetime

import pytest

from webapp.proxy.records import CallRecord
from webapp.proxy.spool import Spool, drain_spool, spooled_segments


def make_record(call_id: str) -> CallRecord:
    now = datetime.now(UTC)
    return CallRecord(
        call_id=call_id,
        rollout_id="r",
        trajectory_id="t",
        started_at=now,
        ended_at=now,
        latency_ms=1.0,
        ttft_ms=None,
        request={"messages": []},
        response=None,
        status_code=200,
    )


def test_a_sealed_segment_is_sent_once_and_deleted(tmp_path):
    spool = Spool(tmp_path)
    spool.append([make_record("a"), make_record("b")])
    spool.append([make_record("c")])
    spool.seal()
    sent: list[str] = []

    result = drain_spool(directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch))

    assert sent == ["a", "b", "c"]
    assert (result.sent, result.segments, result.skipped_lines) == (3, 1, 0)
    assert spooled_segments(tmp_path) == []


def test_a_segment_still_being_written_is_left_alone(tmp_path):
    spool = Spool(tmp_path)
    spool.append([make_record("live")])
    sent: list[str] = []

    drain_spool(directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch))

    assert sent == [] and len(spooled_segments(tmp_path)) == 1
    spool.close()


def _spool_and_die(directory: str) -> None:
    Spool(directory).append([make_record("orphan")])
    os._exit(0)  # no seal, no cleanup: the kernel drops the lock


def test_the_segment_of_a_dead_process_is_drained(tmp_path):
    process = multiprocessing.get_context("fork").Process(target=_spool_and_die, args=(str(tmp_path),))
    process.start()
    process.join(10)
    sent: list[str] = []

    drain_spool(directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch))

    assert sent == ["orphan"]


def test_a_failed_send_keeps_the_segment_for_the_next_drain(tmp_path):
    spool = Spool(tmp_path)
    spool.append([make_record("a"), make_record("b")])
    spool.close()

    def refuse(batch):
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError):
        drain_spool(directory=tmp_path, send_batch=refuse)
    sent: list[str] = []
    drain_spool(directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch))

    assert sent == ["a", "b"]


def test_a_line_torn_by_a_crash_is_skipped_and_the_rest_sent(tmp_path):
    spool = Spool(tmp_path)
    spool.append([make_record("whole")])
    spool.close()
    [segment] = spooled_segments(tmp_path)
    with open(segment, "ab") as handle:
        handle.write(make_record("torn").to_json()[:30])
    sent: list[str] = []

    result = drain_spool(directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch))

    assert sent == ["whole"] and result.skipped_lines == 1


def test_segments_rotate_at_their_size_limit(tmp_path):
    spool = Spool(tmp_path, segment_max_bytes=1)
    spool.append([make_record("a")])
    spool.append([make_record("b")])
    spool.close()
    sent: list[str] = []

    result = drain_spool(
        directory=tmp_path, send_batch=lambda batch: sent.extend(r.call_id for r in batch), batch_size=1
    )

    assert sorted(sent) == ["a", "b"] and result.segments == 2
