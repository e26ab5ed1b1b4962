"""Rollout tokens on the Trove-wired proxy (embedded default: records straight to the database): a real
Postgres, the proxy served on loopback, the scripted upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import pytest
from django.conf import settings as django_settings
from django.db import connection

from experience.models import Step
from tests.webapp.proxy.harness import PROXY_TIMEOUT_S, UpstreamState, new_call_id, send
from tests.webapp.proxy.rollouts import chat_url, finish, running_rollout, stored_call_ids
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.tokens import PostgresLookup, ThreadLookup, TokenResolver
from webapp.proxy.wiring import TOKEN_RESOLVER, make_trove_proxy_app
from webapp.rollouts.models import Rollout, rollout_token_hash

pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = django_settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
LOOKUPS = [PostgresLookup, ThreadLookup] if ON_POSTGRES else [ThreadLookup]
BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}


@pytest.fixture(params=LOOKUPS, ids=lambda lookup: {PostgresLookup: "in-loop", ThreadLookup: "on-a-thread"}[lookup])
def trove_proxy(request, settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    """The Trove-wired proxy, its tokens looked up both ways (on the event loop: Postgres; on a thread:
    the way SQLite is)."""
    settings.REDIS_URL = None  # the embedded default: the proxy writes to the database itself
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    resolver = TokenResolver(lookup=request.param())
    app, sink = make_trove_proxy_app(resolver=resolver, upstream_timeout=PROXY_TIMEOUT_S)
    assert isinstance(sink, InProcessSink)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    server.app = app  # type: ignore[attr-defined]
    yield server, sink
    server.stop()
    sink.close(10)


def test_a_running_rollouts_call_goes_to_its_job_upstream_with_its_key_and_becomes_a_step(
    trove_proxy, upstream: UpstreamState, monkeypatch
):
    server, sink = trove_proxy
    monkeypatch.setenv("TROVE_MODEL_KEY_TEST", "sk-job-secret")
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1", key_ref="env:TROVE_MODEL_KEY_TEST")
    call_id = new_call_id()

    reply = send(chat_url(server, rollout.proxy_token), body=BODY, call_id=call_id)
    sink.flush(10)

    assert reply.status == 200 and reply.json()["choices"][0]["message"]["content"] == "ls -la"
    assert upstream.requests[-1]["headers"]["Authorization"] == "Bearer sk-job-secret"
    assert stored_call_ids(rollout) == [call_id]
    step = Step.objects.get(call_id=call_id)
    assert step.payload["rollout_id"] == str(rollout.pk) and step.tokens_in == 12
    assert "sk-job-secret" not in json.dumps(step.payload)


def test_a_finished_rollouts_token_gets_401_on_its_very_next_call(trove_proxy, upstream: UpstreamState):
    server, sink = trove_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    first, late = new_call_id(), new_call_id()
    assert send(chat_url(server, rollout.proxy_token), body=BODY, call_id=first).status == 200

    finish(rollout)
    reply = send(chat_url(server, rollout.proxy_token), body=BODY, call_id=late)
    models = send(f"{server.base_url}/r/{rollout.proxy_token}/v1/models", method="GET")
    sink.flush(10)

    assert reply.status == 401 and reply.json()["error"]["code"] == "invalid_token"
    assert models.status == 401
    assert stored_call_ids(rollout) == [first], "the refused call is neither forwarded as the rollout's nor stored"


def test_a_token_replaced_by_a_new_attempt_gets_401_and_the_new_one_works(trove_proxy, upstream: UpstreamState):
    server, sink = trove_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    old_token = rollout.proxy_token
    assert send(chat_url(server, old_token), body=BODY).status == 200

    Rollout.objects.filter(pk=rollout.pk).update(token=rollout_token_hash("a-new-attempts-token"))

    assert send(chat_url(server, old_token), body=BODY).status == 401
    assert send(chat_url(server, "a-new-attempts-token"), body=BODY).status == 200


def test_an_unknown_token_gets_401(trove_proxy):
    server, _ = trove_proxy

    reply = send(chat_url(server, "no-such-token"), body=BODY)

    assert reply.status == 401 and reply.json()["error"]["type"] == "authentication_error"


def test_calls_arriving_together_share_token_lookups(trove_proxy, upstream: UpstreamState):
    server, sink = trove_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    resolver = server.app[TOKEN_RESOLVER]  # type: ignore[attr-defined]
    calls = 40

    async def burst() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def one() -> int:
                async with session.post(chat_url(server, rollout.proxy_token), json=BODY) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(one() for _ in range(calls)))

    before = resolver.queries
    statuses = asyncio.run(burst())
    sink.flush(10)

    assert statuses == [200] * calls
    assert resolver.queries - before < calls
    assert len(stored_call_ids(rollout)) == calls


@pytest.mark.skipif(not ON_POSTGRES, reason="drops the lookup's connection the way a Postgres restart does")
def test_a_lookup_connection_the_database_dropped_is_replaced(trove_proxy, upstream: UpstreamState):
    server, _ = trove_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    assert send(chat_url(server, rollout.proxy_token), body=BODY).status == 200  # the lookup thread is connected

    with connection.cursor() as cursor:  # what a database restart does to the lookup thread's connection
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    assert send(chat_url(server, rollout.proxy_token), body=BODY).status == 200



def test_a_rollouts_endpoint_with_token_capture_has_its_calls_ask_for_token_ids(trove_proxy, upstream: UpstreamState):
    """The lookup carries the endpoint's capture mode and policy version source to the proxy."""
    from tests.webapp.rollouts.jobs_factories import make_endpoint

    server, sink = trove_proxy
    endpoint = make_endpoint(f"{upstream.url}/v1", model_names=["scripted-ok"], token_capture="vllm",
                             policy_version_from="header:X-Request-Id")
    rollout = running_rollout(endpoint=endpoint)
    call_id = new_call_id()

    assert send(chat_url(server, rollout.proxy_token), body=BODY, call_id=call_id).status == 200
    sink.flush(10)

    sent = json.loads(upstream.requests[-1]["raw"])
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    payload = Step.objects.get(call_id=call_id).payload
    assert payload["token_capture"] == "vllm" and payload["policy_version"] == "req-ok"
