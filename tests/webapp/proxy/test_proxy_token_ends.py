"""Every way a rollout attempt ends refuses its token on the very next call, with the lookup warm (its
prepared statement in use): on the full stack (Postgres lookup in the proxy's loop, admission in Redis) and
the embedded default (admission in this process). A real Postgres, the proxy served on loopback, the
scripted upstream; nothing forwarded and nothing stored for a refused call."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from experience.models import Trajectory
from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_open
from tests.webapp.proxy.harness import PROXY_TIMEOUT_S, UpstreamState, new_call_id, send
from tests.webapp.proxy.rollouts import WORKER, chat_url, finish, running_rollout, stored_call_ids
from webapp.proxy.locations import proxy_stream
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.tokens import MAX_TOKENS_PER_QUERY, TokenResolver, _running_rollouts_sql
from webapp.proxy.wiring import (
    TOKEN_RESOLVER,
    close_and_count_admitted,
    database_sink,
    make_trove_proxy_app,
    redis_client,
)
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, rollout_token_hash
from webapp.rollouts.services import job_cancel, rollout_cancel, rollout_reap, rollout_requeue, rollout_start

pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = django_settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
STACKS = ["full-stack", "embedded"] if django_settings.REDIS_URL else ["embedded"]
BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}


@pytest.fixture(params=STACKS)
def proxy(request, settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    """The Trove-wired proxy, counting in Redis (full stack) or in this process (embedded)."""
    if request.param == "embedded":
        settings.REDIS_URL = None
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    sink = database_sink()  # records straight to the database: what is stored is known at flush
    app, _ = make_trove_proxy_app(sink=sink, resolver=TokenResolver(), upstream_timeout=PROXY_TIMEOUT_S)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    server.app = app  # type: ignore[attr-defined]
    yield server, sink
    server.stop()
    sink.close(10)


def warm(server: ProxyServer, rollout: Rollout) -> list[str]:
    """A few calls of the attempt, so the lookup's statement is prepared and reused before the end."""
    call_ids = [new_call_id() for _ in range(3)]
    for call_id in call_ids:
        assert send(chat_url(server, rollout.proxy_token), body=BODY, call_id=call_id).status == 200
    return call_ids


def assert_refused_next(
    server: ProxyServer, sink: InProcessSink, rollout: Rollout, upstream: UpstreamState, earlier: list[str]
) -> None:
    forwarded = len(upstream.requests)
    reply = send(chat_url(server, rollout.proxy_token), body=BODY, call_id=new_call_id())
    sink.flush(10)
    assert reply.status == 401 and reply.json()["error"]["code"] == "invalid_token"
    assert len(upstream.requests) == forwarded, "nothing went upstream for the ended attempt"
    assert stored_call_ids(rollout) == earlier, "the refused call is not stored"


def test_a_finished_rollouts_token_is_refused_on_its_next_call(proxy, upstream: UpstreamState):
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)

    finish(rollout, Rollout.Status.FAILED)

    assert_refused_next(server, sink, rollout, upstream, earlier)


def test_a_cancelled_jobs_token_is_refused_on_its_next_call(proxy, upstream: UpstreamState):
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)

    assert job_cancel(job=rollout.job) == 1  # the runner has not noticed yet (its next heartbeat would)

    assert_refused_next(server, sink, rollout, upstream, earlier)


def test_a_cancelled_rollouts_token_is_refused_on_its_next_call(proxy, upstream: UpstreamState):
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)

    assert rollout_cancel(rollout=rollout)

    assert_refused_next(server, sink, rollout, upstream, earlier)


def test_a_reaped_rollouts_token_is_refused_and_its_next_attempts_token_works(proxy, upstream: UpstreamState):
    """Its worker stopped heartbeating (it died, or lost the broker while its harness kept calling): the
    reaper requeues it, and the next attempt gets a token of its own."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)
    stale = timezone.now() - timedelta(seconds=django_settings.TROVE_ROLLOUT_STALE_S + 5)
    Rollout.objects.filter(pk=rollout.pk).update(heartbeat_at=stale)
    rollout.refresh_from_db()

    assert rollout_reap(rollout=rollout) == Rollout.Status.QUEUED
    assert_refused_next(server, sink, rollout, upstream, earlier)

    def reopened(claimed: Rollout) -> Trajectory:  # the next attempt's trajectory, as the runner opens it
        return trajectory_open(
            rollout_runner=True,
            record=TrajectoryRecord(
                source="rollout",
                source_format="trove-rollout",
                source_ref=f"rollout:{claimed.pk}:attempt:{claimed.attempt}",
                task_key=claimed.task.key,
                status="running",
                started_at=datetime.now(UTC),
            ),
        )

    retried = rollout_start(rollout_id=rollout.pk, worker="another-worker", open_trajectory=reopened)
    assert retried is not None and retried.proxy_token != rollout.proxy_token
    assert send(chat_url(server, retried.proxy_token), body=BODY).status == 200
    assert send(chat_url(server, rollout.proxy_token), body=BODY).status == 401, (
        "the old attempt's token stays dead"
    )


def test_a_requeued_rollouts_token_is_refused_on_its_next_call(proxy, upstream: UpstreamState):
    """The runner lost its sandbox's lease (or met another transient failure) and gives the rollout back."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)

    assert rollout_requeue(rollout_id=rollout.pk, worker=WORKER, error="lost the sandbox's lease")

    assert_refused_next(server, sink, rollout, upstream, earlier)


def test_a_closed_gate_refuses_a_running_rollouts_token(proxy, upstream: UpstreamState):
    """The harness exited and its runner closed the gate: the rollout is still running in the database (the
    runner is waiting for its records), and a process the harness left behind gets nothing more."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    earlier = warm(server, rollout)

    assert close_and_count_admitted(rollout.proxy_token).admitted == 3

    assert_refused_next(server, sink, rollout, upstream, earlier)
    assert Rollout.objects.get(pk=rollout.pk).status == Rollout.Status.RUNNING


def test_an_endpoint_change_holds_from_the_next_call(proxy, upstream: UpstreamState):
    """Nothing of a token's answer is kept: ops taking private addresses away from an endpoint mid-attempt
    stops its very next call."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    warm(server, rollout)
    forwarded = len(upstream.requests)

    ModelEndpoint.objects.filter(pk=rollout.job.endpoint_id).update(allow_private_network=False)
    reply = send(chat_url(server, rollout.proxy_token), body=BODY)

    assert reply.status == 403 and reply.json()["error"]["code"] == "endpoint_refused"
    assert len(upstream.requests) == forwarded


def test_a_flood_of_unknown_tokens_is_refused_and_leaves_a_bounded_set_of_statements(
    proxy, upstream: UpstreamState
):
    """Unknown tokens arriving together with a real one: each refused, the real one served, and however
    many arrive, the lookup uses one of a few statement shapes (each prepared once per connection) and
    keeps nothing per token."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    resolver = server.app[TOKEN_RESOLVER]  # type: ignore[attr-defined]
    unknown = [f"forged-{index}" for index in range(700)]

    async def flood() -> tuple[list[int], int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one(token: str) -> int:
                async with session.post(chat_url(server, token), json=BODY) as response:
                    await response.read()
                    return response.status

            *refused, served = await asyncio.gather(
                *(one(token) for token in [*unknown, rollout.proxy_token])
            )
            return refused, served

    forwarded = len(upstream.requests)
    refused, served = asyncio.run(flood())
    sink.flush(10)

    assert refused == [401] * len(unknown) and served == 200
    assert len(upstream.requests) == forwarded + 1
    assert len(stored_call_ids(rollout)) == 1
    assert not resolver._waiting, "no token is held once answered"
    shapes = [size for size in range(1, MAX_TOKENS_PER_QUERY + 1) if size & (size - 1) == 0]
    assert _running_rollouts_sql.cache_info().currsize <= len(shapes)


@pytest.mark.skipif(not ON_POSTGRES, reason="a prepared statement outlived by a schema change: Postgres")
def test_a_schema_change_under_a_prepared_lookup_costs_no_call(proxy, upstream: UpstreamState):
    """A migration that changes a column the lookup returns makes its prepared statement stale; the next
    call is still answered (a new connection prepares it afresh), not refused with 503."""
    server, sink = proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    warm(server, rollout)
    table = connection.ops.quote_name(RolloutJob._meta.db_table)

    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} ALTER COLUMN max_steps TYPE bigint")
    try:
        reply = send(chat_url(server, rollout.proxy_token), body=BODY)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN max_steps TYPE integer")

    assert reply.status == 200


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the count is in Redis")
def test_a_known_tokens_call_counted_while_its_token_is_checked_is_taken_back_when_the_check_refuses(
    settings, tmp_path, upstream: UpstreamState
):
    """A token that resolved before has its next call counted and checked at once (full stack); the check
    refusing it (the job was cancelled meanwhile) takes the count back, so the attempt's count and its step
    budget are what was forwarded."""
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    sink = database_sink()
    app, _ = make_trove_proxy_app(sink=sink, resolver=TokenResolver(), upstream_timeout=PROXY_TIMEOUT_S)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    try:
        rollout = running_rollout(
            upstream_v1=f"{upstream.url}/v1", harness="external", harness_command="agent", max_steps=5
        )
        earlier = warm(server, rollout)
        assert app[TOKEN_RESOLVER].known_budget(rollout.proxy_token) == 5, (
            "its calls take the overlapped path"
        )

        job_cancel(job=rollout.job)
        assert_refused_next(server, sink, rollout, upstream, earlier)
        assert app[TOKEN_RESOLVER].known_budget(rollout.proxy_token) is None, "a refused token is forgotten"
        client = redis_client(settings.REDIS_URL)
        budget = client.hgetall(f"{proxy_stream()}:admitted:{rollout_token_hash(rollout.proxy_token)}:budget")
        count = close_and_count_admitted(rollout.proxy_token)
    finally:
        server.stop()
        sink.close(10)

    assert budget[b"forwarded"] == b"3", "the refused call is not spent from the budget"
    assert count is not None and count.admitted == 3, "the runner waits for the three records there are"


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the count is in Redis")
def test_only_tokens_that_resolved_are_known_and_their_number_is_bounded(
    proxy, upstream: UpstreamState, monkeypatch
):
    server, sink = proxy
    resolver = server.app[TOKEN_RESOLVER]  # type: ignore[attr-defined]
    monkeypatch.setattr("webapp.proxy.tokens.KNOWN_TOKENS", 2)
    rollouts = [running_rollout(upstream_v1=f"{upstream.url}/v1") for _ in range(3)]

    for token in ["forged-1", *(rollout.proxy_token for rollout in rollouts), "forged-2"]:
        send(chat_url(server, token), body=BODY)

    assert resolver.known_budget("forged-1") is None and resolver.known_budget("forged-2") is None
    assert [resolver.known_budget(rollout.proxy_token) for rollout in rollouts] == [None, 0, 0]
