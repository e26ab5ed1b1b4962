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
