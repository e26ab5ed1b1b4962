"""The recording proxy on the full stack: Trove's proxy app in a thread with its default sink (a Redis
stream), a real Redis and Postgres, the ingest task run as its function, and a scripted upstream.

Each test has a stream and a spool directory of its own, so runs sharing this Redis do not meet.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings as django_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from experience.models import Step, Trajectory
from tests.redis_keys import forget_stream, unique_stream
from tests.webapp.proxy.harness import UpstreamState, closed_port, new_call_id, send, upstream  # noqa: F401
from tests.webapp.proxy.rollouts import finish, running_rollout
from webapp.proxy.locations import proxy_spool_dir, proxy_stream
from webapp.proxy.recorder import RedisStreamSink, consume_stream, redis_stream_sender
from webapp.proxy.records import CallRecord
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.spool import drain_spool, spooled_segments
from webapp.proxy.wiring import INGEST_GROUP, ingest_pending_records, make_trove_proxy_app, write_call_records
from webapp.rollouts.models import Rollout
from workers.tasks.proxy import ingest_proxy_records

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}
STREAM_BODY = {**BODY, "model": "scripted-stream", "stream": True}


@pytest.fixture
def full_stack(settings, tmp_path) -> Iterator[redis.Redis]:
    """This test's stream and spool on the full stack's Redis; the stream is removed afterwards."""
    if django_settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql" or not settings.REDIS_URL:
        pytest.fail("the proxy stack tests need DATABASE_URL (Postgres) and REDIS_URL")
    settings.TROVE_PROXY_STREAM = unique_stream("proxy-stack")
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    forget_stream(client, settings.TROVE_PROXY_STREAM)
    client.close()


@pytest.fixture
def rollout(full_stack, upstream: UpstreamState) -> Rollout:  # noqa: F811
    return running_rollout(upstream_v1=f"{upstream.url}/v1")


@pytest.fixture
def stack_proxy(full_stack) -> Iterator[tuple[ProxyServer, RedisStreamSink]]:
    app, sink = make_trove_proxy_app()
    assert isinstance(sink, RedisStreamSink), "with REDIS_URL the proxy records through the stream"
    server = serve_in_thread(app, shutdown_timeout=0.5)
    yield server, sink
    server.stop()
    sink.close(10)


def chat(server: ProxyServer, token: str, body: dict = BODY, call_id: str | None = None):
    return send(f"{server.base_url}/r/{token}/v1/chat/completions", body=body, call_id=call_id)


def model_calls(rollout: Rollout) -> list[Step]:
    return list(Step.objects.filter(trajectory_id=rollout.trajectory_id, kind="model_call").order_by("seq"))


def call_ids(rollout: Rollout) -> list[str]:
    return [step.call_id for step in model_calls(rollout)]


def test_calls_land_as_model_call_steps_once_the_ingest_task_has_run(stack_proxy, rollout, full_stack):
    server, sink = stack_proxy
    plain, streamed = new_call_id(), new_call_id()

    assert chat(server, rollout.proxy_token, call_id=plain).status == 200
    reply = chat(server, rollout.proxy_token, STREAM_BODY, call_id=streamed)
    assert sink.flush(10)
    waiting_in_the_stream = full_stack.xlen(proxy_stream())
    report = ingest_proxy_records(max_seconds=10)

    assert reply.status == 200 and b"[DONE]" in reply.body
    assert waiting_in_the_stream == 2
    assert (report["records"], report["stored"], report["dead_lettered"]) == (2, 2, 0)
    steps = {step.call_id: step for step in model_calls(rollout)}
    assert set(steps) == {plain, streamed}
    assert steps[plain].tokens_in == 12 and steps[plain].payload["rollout_id"] == str(rollout.pk)
    assert steps[streamed].payload["stream"] is True and steps[streamed].payload["ttft_ms"] > 0
    assert full_stack.xlen(proxy_stream()) == 0, "acked entries are deleted: the stream is a work queue"
    assert full_stack.xinfo_consumers(proxy_stream(), INGEST_GROUP) == [], "each run removes its consumer"
    assert ingest_proxy_records(max_seconds=10)["stored"] == 0


def test_with_redis_down_calls_are_spooled_then_drained_once_it_is_back_and_each_is_stored_once(
    settings, full_stack, rollout, tmp_path
):
    port = closed_port()
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"  # the whole stack's Redis, down
    sink = RedisStreamSink(url=settings.REDIS_URL, spool_dir=proxy_spool_dir(), stream=proxy_stream(),
                           retry_interval_s=0.3)
    app, _ = make_trove_proxy_app(sink=sink)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    redis_server = None
    try:
        made = [new_call_id() for _ in range(6)]
        statuses = [chat(server, rollout.proxy_token, call_id=call_id).status for call_id in made]
        assert sink.flush(10)
        spooled, while_down = sink.spooled, ingest_proxy_records(max_seconds=2)

        redis_server = start_redis_server(port, tmp_path)
        wait_until(lambda: not spooled_segments(proxy_spool_dir()), what="the spool to drain")
        report = ingest_proxy_records(max_seconds=10)
    finally:
        server.stop()
        sink.close(10)
        if redis_server is not None:
            redis_server.terminate()
            redis_server.wait(10)

    assert statuses == [200] * 6, "the harness never notices the outage"
    assert spooled == 6 and "error" in while_down
    assert sorted(call_ids(rollout)) == sorted(made)
    assert report["stored"] == 6


def test_records_delivered_again_add_no_steps(stack_proxy, rollout, full_stack):
    server, sink = stack_proxy
    made = [new_call_id() for _ in range(3)]
    for call_id in made:
        chat(server, rollout.proxy_token, call_id=call_id)
    assert sink.flush(10)
    stream = proxy_stream()
    entries = [fields for _, fields in full_stack.xrange(stream)]
    ingest_proxy_records(max_seconds=10)

    # A batch written but not acked (the consumer died in between) is redelivered to that consumer...
    for fields in entries:
        full_stack.xadd(stream, fields)

    def write_then_die(records):
        write_call_records(records)
        raise RuntimeError("killed before the ack")

    consume_stream(full_stack, write_then_die, group=INGEST_GROUP, consumer="dies", stream=stream,
                   block_ms=50, until_idle=True, retry_backoff_s=0, max_seconds=1)
    consume_stream(full_stack, write_call_records, group=INGEST_GROUP, consumer="dies", stream=stream,
                   block_ms=50, until_idle=True)
    # ...and a spool replayed after its records were already sent goes through the stream once more.
    for fields in entries:
        full_stack.xadd(stream, fields)
    report = ingest_proxy_records(max_seconds=10)

    assert call_ids(rollout) == made
    assert report["records"] == 3 and report["stored"] == 0


def test_a_finished_rollouts_token_gets_401_at_once_and_its_earlier_calls_are_kept(stack_proxy, rollout):
    server, sink = stack_proxy
    before = new_call_id()
    assert chat(server, rollout.proxy_token, call_id=before).status == 200

    finish(rollout)
    after = chat(server, rollout.proxy_token)
    assert sink.flush(10)
    ingest_proxy_records(max_seconds=10)

    assert after.status == 401 and after.json()["error"]["code"] == "invalid_token"
    assert call_ids(rollout) == [before]


def test_a_runner_waiting_for_its_calls_stores_them_itself(stack_proxy, rollout, settings):
    server, sink = stack_proxy
    made = [new_call_id() for _ in range(4)]
    for call_id in made:
        chat(server, rollout.proxy_token, call_id=call_id)

    handed, deadline = 0, time.monotonic() + 30
    while len(call_ids(rollout)) < 4 and time.monotonic() < deadline:  # as the runner waits (no sink flush)
        handed += ingest_pending_records(timeout_s=1)

    assert handed == 4 and sorted(call_ids(rollout)) == sorted(made)
    settings.REDIS_URL = None
    assert ingest_pending_records(timeout_s=1) == 0, "embedded: the proxy wrote them itself"


def test_a_record_whose_trajectory_is_gone_goes_to_the_dead_letter_stream_and_the_rest_are_stored(
    stack_proxy, rollout, full_stack, upstream: UpstreamState  # noqa: F811
):
    server, sink = stack_proxy
    doomed = running_rollout(upstream_v1=f"{upstream.url}/v1")
    kept, lost = new_call_id(), new_call_id()
    chat(server, rollout.proxy_token, call_id=kept)
    chat(server, doomed.proxy_token, call_id=lost)
    assert sink.flush(10)
    Trajectory.objects.filter(pk=doomed.trajectory_id).delete()

    report = ingest_proxy_records(max_seconds=10)

    assert call_ids(rollout) == [kept]
    assert (report["stored"], report["dead_lettered"]) == (1, 1)
    [(_, letter)] = full_stack.xrange(f"{proxy_stream()}:dead")
    assert letter[b"reason"] == b"trajectory_gone" and lost.encode() in letter[b"record"]
    assert full_stack.xlen(proxy_stream()) == 0, "the set-aside record does not hold the stream back"


def test_only_one_scheduled_ingest_runs_at_a_time(full_stack):
    held = full_stack.lock(f"{proxy_stream()}:ingest-lock", timeout=30)
    assert held.acquire(blocking=False)
    try:
        assert ingest_proxy_records(max_seconds=1) == {"skipped": "another ingest is running"}
    finally:
        held.release()
    assert "records" in ingest_proxy_records(max_seconds=1)


def test_beat_sends_the_ingest_every_second_on_the_full_stack():
    from webapp.celery import app

    entry = django_settings.CELERY_BEAT_SCHEDULE["proxy-ingest"]

    assert entry["task"] == "trove.proxy.ingest" and entry["schedule"] == 1.0
    assert "trove.proxy.ingest" in app.tasks


def start_redis_server(port: int, directory) -> subprocess.Popen:
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--dir", str(directory)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    wait_until(lambda: _answers(client), what="the restarted Redis to answer")
    return process


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def wait_until(condition, *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_scheduled_ingest_removes_consumers_a_killed_worker_left_holding_nothing(full_stack, monkeypatch):
    from webapp.proxy import wiring

    stream = proxy_stream()
    full_stack.xgroup_create(stream, INGEST_GROUP, id="0", mkstream=True)
    full_stack.xgroup_createconsumer(stream, INGEST_GROUP, "ingest:killed-worker")  # its entries claimed since
    monkeypatch.setattr(wiring, "ABANDONED_CONSUMER_MS", 0)

    report = ingest_proxy_records(max_seconds=1)

    assert report["pruned_consumers"] == 1
    assert full_stack.xinfo_consumers(stream, INGEST_GROUP) == []


def test_a_batch_cut_off_mid_send_is_spooled_whole_and_each_call_is_stored_once(
    stack_proxy, rollout, full_stack, tmp_path
):
    server, sink = stack_proxy
    made = [new_call_id() for _ in range(5)]
    for call_id in made:
        assert chat(server, rollout.proxy_token, call_id=call_id).status == 200
    assert sink.flush(10)
    # The sink sent the five as batch entries (how many depends on when its writer woke up).
    entries = full_stack.xrange(proxy_stream())
    records = [CallRecord.from_json(line) for _, fields in entries for line in fields[b"records"].split(b"\n")]
    assert [r.call_id for r in records] == made
    full_stack.delete(proxy_stream())
    # The connection broke after Redis had applied the first part of the batch: those two are in the
    # stream, and the sink, seeing the error, spooled the whole batch.
    redis_stream_sender(full_stack, stream=proxy_stream())(records[:2])
    down = redis.Redis(host="127.0.0.1", port=closed_port(), retry=Retry(NoBackoff(), 0))
    broken = RedisStreamSink(client=down, stream=proxy_stream(), spool_dir=tmp_path / "broken-spool")
    for record in records:
        broken.put(record)
    broken.close(10)

    drained = drain_spool(directory=tmp_path / "broken-spool",
                          send_batch=redis_stream_sender(full_stack, stream=proxy_stream()))
    report = ingest_proxy_records(max_seconds=10)

    assert broken.spooled == 5 and drained.sent == 5
    assert report["records"] == 7, "two delivered twice: at least once"
    assert report["stored"] == 5 and call_ids(rollout) == made, "each call stored once, in order"


def test_calls_a_killed_runner_had_read_are_taken_over_and_stored(stack_proxy, rollout, full_stack, monkeypatch):
    """A runner drains the stream while its harness runs; killed between reading entries and storing them,
    it leaves them pending under its name. Another consumer takes them over once they have been pending for
    PENDING_TAKEOVER_MS, and each call is stored once."""
    from webapp.proxy import wiring

    server, sink = stack_proxy
    made = [new_call_id() for _ in range(3)]
    for call_id in made:
        assert chat(server, rollout.proxy_token, call_id=call_id).status == 200
    assert sink.flush(10)
    full_stack.xgroup_create(proxy_stream(), INGEST_GROUP, id="0", mkstream=True)
    full_stack.xreadgroup(INGEST_GROUP, "runner:killed", {proxy_stream(): ">"})  # read, never acknowledged

    assert ingest_pending_records(0.3) == 0, "pending under a consumer that may still be alive: left to it"
    assert call_ids(rollout) == []

    monkeypatch.setattr(wiring, "PENDING_TAKEOVER_MS", 200)
    time.sleep(0.3)
    assert ingest_pending_records(1.0) == 3
    assert call_ids(rollout) == made
    assert full_stack.xpending(proxy_stream(), INGEST_GROUP)["pending"] == 0
