"""The record catch-up thread is one per process, kept across rollouts (with its database connection)."""

from __future__ import annotations

import threading

import pytest

from workers.rollout_runner import RecordCatchUp


def catch_up_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "record-catch-up"]


def test_rollouts_one_after_another_and_side_by_side_share_one_catch_up_thread(settings):
    if not settings.REDIS_URL:  # the thread drains the proxy's Redis stream: the tests' own db, never another
        pytest.fail("the record catch-up drains the proxy's Redis stream: run this with REDIS_URL set")
    with RecordCatchUp():
        first = catch_up_threads()
    with RecordCatchUp(), RecordCatchUp():
        during = catch_up_threads()
        assert RecordCatchUp._wanted.is_set()

    assert len(first) == 1 and during == first and first[0].is_alive()
    assert RecordCatchUp._running == 0 and not RecordCatchUp._wanted.is_set()  # idle: drains nothing


class SleepLog:
    """Stands in for the runner's `time` module: real clocks, sleeps recorded (and skipped)."""

    def __init__(self) -> None:
        import time

        self.real, self.sleeps = time, []
        self.monotonic, self.perf_counter = time.monotonic, time.perf_counter

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


@pytest.mark.django_db(transaction=True)
def test_a_wait_for_records_that_found_none_in_the_stream_does_not_sleep_a_second_slice(settings, monkeypatch):
    from workers import rollout_runner

    if not settings.REDIS_URL:
        pytest.fail("the stream read blocks only with Redis: run this with REDIS_URL set")
    clock = SleepLog()
    monkeypatch.setattr(rollout_runner, "time", clock)

    rollout_runner._catch_up(rollout_runner.INGEST_SLICE_S)  # an empty stream: the read blocked for the slice

    assert all(seconds < rollout_runner.INGEST_SLICE_S / 2 for seconds in clock.sleeps), clock.sleeps


@pytest.mark.django_db(transaction=True)
def test_a_wait_for_records_without_a_reachable_redis_sleeps_its_slice_rather_than_spin(settings, monkeypatch):
    from workers import rollout_runner

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens: the read fails at once
    clock = SleepLog()
    monkeypatch.setattr(rollout_runner, "time", clock)

    rollout_runner._catch_up(rollout_runner.INGEST_SLICE_S)

    assert len(clock.sleeps) == 1 and clock.sleeps[0] > rollout_runner.INGEST_SLICE_S / 2
