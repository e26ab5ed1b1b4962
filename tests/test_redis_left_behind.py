"""The run's Redis check (tests/conftest.py): a run that leaves keys of its own, or records in the proxy's
dead letter, fails and names them; the keys are gone afterwards; another run's keys are never its concern."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.redis_keys import QUEUE_PREFIX, forget_queue, leftover_keys, unique_queue
from webapp.celery import app

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def client():
    if not settings.REDIS_URL:
        pytest.fail("the Redis check is tested on the tests' Redis: run this with REDIS_URL set")
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def run_probe(*test_names: str) -> subprocess.CompletedProcess:
    """tests/redis_leak_probe.py's test in a pytest of its own on the same Redis db, with a database name of
    its own (never created: the probe reads no rows), so its proxy stream is not this run's."""
    db = settings.DATABASES["default"]
    name = f"{db.get('TEST', {}).get('NAME') or db['NAME']}_probe"
    env = dict(os.environ, REDIS_URL=settings.REDIS_URL, SECRET_KEY="trove-test-secret",
               DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{name}")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *(f"tests/redis_leak_probe.py::{name}" for name in test_names)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_run_that_leaves_a_key_of_its_own_fails_naming_it_and_the_key_is_removed(client):
    result = run_probe("test_it_leaves_a_message_in_a_queue_of_its_own")

    assert result.returncode != 0, result.stdout
    # The failure's own section, not the short summary's line: pytest writes the whole message there too when
    # it runs on CI (the CI variable set), so the phrase can appear twice.
    [line] = [line for line in result.stdout.splitlines()
              if line.startswith("this test run left 1 key(s) in Redis")]
    [key] = line.split(": ", 1)[1].split(". The fixture")[0].split(", ")
    assert key.startswith("trove-test-") and "-probe-" in key
    assert client.exists(key) == 0, "the check removes what it reports"


def test_a_record_in_the_proxys_dead_letter_fails_the_test_that_made_it(client):
    result = run_probe("test_it_leaves_a_record_in_the_proxys_dead_letter")

    assert result.returncode != 0, result.stdout
    assert "ERROR at teardown of test_it_leaves_a_record_in_the_proxys_dead_letter" in result.stdout
    assert "the proxy set aside 1 record(s) in the dead letter trove:proxy:calls:" in result.stdout
    assert "probe_reason: set aside by the probe" in result.stdout
    stream = result.stdout.split("in the dead letter ", 1)[1].split(" ", 1)[0]
    assert stream.endswith("_probe:dead") and client.exists(stream) == 0


def test_messages_sent_to_no_queue_of_the_tests_own_are_dropped_and_the_run_passes(client):
    result = run_probe("test_it_sends_a_message_to_no_queue_of_its_own", "test_the_message_is_gone_in_the_next_test")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_only_this_runs_keys_are_its_concern(client):
    another_runs = "trove-test-0another-jobs-0123abcd"
    mine = unique_queue("mine")
    client.lpush(another_runs, b"x")
    client.lpush(mine, b"x")
    try:
        left = leftover_keys(client, proxy_stream=None)
        assert mine in left and another_runs not in left
        assert all(QUEUE_PREFIX in key for key in left)
    finally:
        forget_queue(client, mine)
        client.delete(another_runs)
    assert mine not in leftover_keys(client, proxy_stream=None)


def test_forget_queue_removes_every_key_kombu_made_for_a_queue(client):
    queue = unique_queue("kombu")
    previous, app.conf.task_default_queue = app.conf.task_default_queue, queue
    try:
        app.send_task("trove.probe.nothing", kwargs={"n": 1})  # declares the queue and its bindings
    finally:
        app.conf.task_default_queue = previous
    made = sorted(k.decode() for k in client.scan_iter(match=f"*{queue}*"))
    assert queue in made and f"_kombu.binding.{queue}" in made

    forget_queue(client, queue)

    assert list(client.scan_iter(match=f"*{queue}*")) == []


def test_a_message_a_killed_worker_took_from_this_runs_queue_is_found_and_removed(client):
    mine, another_runs = unique_queue("killed"), "trove-test-0another-killed-0123abcd"
    for tag, queue in (("tag-mine", mine), ("tag-another", another_runs)):  # kombu's layout: [message, exchange, key]
        client.hset("unacked", tag, json.dumps([{"body": "x"}, "", queue]))
        client.zadd("unacked_index", {tag: 1.0})
    try:
        assert "unacked -> tag-mine" in leftover_keys(client, proxy_stream=None)
        assert "unacked -> tag-another" not in leftover_keys(client, proxy_stream=None)

        forget_queue(client, mine)

        assert client.hexists("unacked", "tag-mine") == 0 and client.zscore("unacked_index", "tag-mine") is None
        assert client.hexists("unacked", "tag-another") == 1, "another run's message is not this run's to remove"
    finally:
        client.hdel("unacked", "tag-mine", "tag-another")
        client.zrem("unacked_index", "tag-mine", "tag-another")
