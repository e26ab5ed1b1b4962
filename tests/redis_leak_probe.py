"""Tests that leave something in Redis, run by tests/test_redis_left_behind.py in a pytest of their own to
show that the run fails and says what was left (never collected by the suite: not named test_*.py)."""

from __future__ import annotations

import redis
from django.conf import settings

from tests.redis_keys import unique_queue


def test_it_leaves_a_message_in_a_queue_of_its_own():
    redis.Redis.from_url(settings.REDIS_URL).lpush(unique_queue("probe"), b"a message nobody takes")


def test_it_leaves_a_record_in_the_proxys_dead_letter(run_redis):
    # The test database's stream (webapp/proxy/locations.proxy_stream() in a test that reads rows).
    run_redis.client.xadd(f"{run_redis.proxy_stream}:dead", {"reason": "probe_reason", "error": "set aside by the probe"})


def test_it_sends_a_message_to_no_queue_of_its_own(run_redis):
    from webapp.celery import app

    app.send_task("trove.probe.nothing", kwargs={"n": 1})
    assert run_redis.client.llen(run_redis.default_queue) == 1, "it went to the run's default queue"


def test_the_message_is_gone_in_the_next_test(run_redis):
    assert run_redis.client.llen(run_redis.default_queue) == 0
