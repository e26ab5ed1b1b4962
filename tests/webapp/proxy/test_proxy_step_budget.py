"""The job's step budget held at the proxy for every external harness (webapp/proxy/admission.py): the
attempt's call max_steps + 1 and later are answered 403 in the harness's own protocol and never reach the
upstream, counted in the same admission as the call (Redis on the full stack, the proxy's process in the
embedded default). A real proxy as Trove wires it, a real database, the scripted upstream counting what
reaches it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import pytest
from django.conf import settings as django_settings

from tests.webapp.proxy.harness import PROXY_TIMEOUT_S, UpstreamState, new_call_id, send
from tests.webapp.proxy.rollouts import chat_url, running_rollout, stored_call_ids
from webapp.proxy.admission import GateCount
from webapp.proxy.app import CALL_ID_HEADER, STEP_BUDGET_CODE
from webapp.proxy.protocols import PROTOCOLS
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.wiring import close_and_count_admitted, database_sink, make_trove_proxy_app

pytestmark = pytest.mark.django_db(transaction=True)

# Each protocol's call as its harness sends it (to a chat endpoint: the proxy translates), and where.
CALLS = {
    "chat": ("v1/chat/completions", {"model": "scripted-ok", "messages": [{"role": "user", "content": "Go."}]}),
    "responses": ("v1/responses", {"model": "scripted-ok", "input": "Go."}),
    "messages": ("v1/messages", {"model": "scripted-ok", "max_tokens": 64,
                                 "messages": [{"role": "user", "content": "Go."}]}),
    "gemini": ("v1beta/models/scripted-ok:generateContent", {"contents": [{"role": "user", "parts": [{"text": "Go."}]}]}),
}


@pytest.fixture(params=["redis", "in-process"])
def budget_proxy(request, settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    """The proxy as Trove wires it, counting in Redis (full stack) or in this process (no REDIS_URL)."""
    if request.param == "redis" and not django_settings.REDIS_URL:
        pytest.skip("the full stack's count is kept in Redis (REDIS_URL)")
    if request.param == "in-process":
        settings.REDIS_URL = None  # the embedded default: close_and_count_admitted reads this process's count
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    sink = database_sink()  # records straight to the database: what is stored is known at flush
    app, _ = make_trove_proxy_app(sink=sink, upstream_timeout=PROXY_TIMEOUT_S)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    yield server, sink
    server.stop()
    sink.close(10)


def model_calls_upstream(upstream: UpstreamState) -> int:
    return sum(1 for request in upstream.requests if request["body"] is not None)


def external_rollout(upstream: UpstreamState, max_steps: int):
    return running_rollout(upstream_v1=f"{upstream.url}/v1", harness="external", harness_command="agent",
                           max_steps=max_steps)


@pytest.mark.parametrize("protocol", list(CALLS))
def test_call_max_steps_plus_one_is_refused_in_the_harnesss_protocol_and_never_reaches_the_upstream(
    budget_proxy, upstream: UpstreamState, protocol
):
    server, sink = budget_proxy
    rollout = external_rollout(upstream, max_steps=3)
    path, body = CALLS[protocol]
    url = f"{server.base_url}/r/{rollout.proxy_token}/{path}"
    before = model_calls_upstream(upstream)

    replies = [send(url, body=body, call_id=new_call_id()) for _ in range(5)]
    sink.flush(10)

    assert [reply.status for reply in replies] == [200, 200, 200, 403, 403]
    assert model_calls_upstream(upstream) - before == 3, "nothing of the refused calls went upstream"
    message = "the job's step budget of 3 model calls is spent: the proxy forwards no more calls for this rollout"
    assert replies[3].json() == replies[4].json() == PROTOCOLS[protocol].error_body(STEP_BUDGET_CODE, message)
    refused = replies[3]
    assert refused.headers["x-should-retry"] == "false", "an SDK must not retry what no retry can help"
    assert len(stored_call_ids(rollout)) == 3, "a refused call is no model call of the policy's: not stored"
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=3, refused=2)


def test_count_tokens_models_and_pre_connects_are_not_model_calls_and_spend_nothing(
    budget_proxy, upstream: UpstreamState
):
    server, sink = budget_proxy
    rollout = external_rollout(upstream, max_steps=1)
    root = f"{server.base_url}/r/{rollout.proxy_token}"
    _, messages_body = CALLS["messages"]
    _, gemini_body = CALLS["gemini"]
    for _ in range(3):
        assert send(f"{root}/v1/messages/count_tokens", body=messages_body).status == 200
        assert send(f"{root}/v1beta/models/scripted-ok:countTokens", body=gemini_body).status == 200
        assert send(f"{root}/", method="HEAD").status == 200
        assert send(f"{root}/v1/models", method="GET").status == 200

    first = send(chat_url(server, rollout.proxy_token), body=CALLS["chat"][1], call_id=new_call_id())
    second = send(chat_url(server, rollout.proxy_token), body=CALLS["chat"][1], call_id=new_call_id())

    assert (first.status, second.status) == (200, 403)
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=1, refused=1)


def test_a_harness_repeating_one_call_id_cannot_get_past_the_budget(budget_proxy, upstream: UpstreamState):
    # The store keeps one step per call id, so the runner's count is by call id; the budget is not: every
    # repeat is forwarded upstream and costs a call.
    server, sink = budget_proxy
    rollout = external_rollout(upstream, max_steps=2)
    before = model_calls_upstream(upstream)
    call_id = new_call_id()

    statuses = [send(chat_url(server, rollout.proxy_token), body=CALLS["chat"][1], call_id=call_id).status
                for _ in range(5)]
    sink.flush(10)

    assert statuses == [200, 200, 403, 403, 403]
    assert model_calls_upstream(upstream) - before == 2
    assert stored_call_ids(rollout) == [call_id]
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=1, refused=3)


def test_concurrent_calls_racing_at_the_boundary_never_admit_more_than_the_budget(
    budget_proxy, upstream: UpstreamState
):
    server, sink = budget_proxy
    rollout = external_rollout(upstream, max_steps=4)
    before = model_calls_upstream(upstream)
    data = json.dumps(CALLS["chat"][1]).encode()

    async def race() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def one() -> int:
                async with session.post(chat_url(server, rollout.proxy_token), data=data, headers={
                        "Content-Type": "application/json", CALL_ID_HEADER: new_call_id()}) as response:
                    await response.read()
                    return response.status
            return await asyncio.gather(*(one() for _ in range(24)))

    statuses = asyncio.run(race())
    sink.flush(10)

    assert sorted(statuses) == [200] * 4 + [403] * 20
    assert model_calls_upstream(upstream) - before == 4
    assert len(stored_call_ids(rollout)) == 4
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=4, refused=20)


def test_the_budget_is_per_attempt_and_a_closed_gate_still_answers_401(budget_proxy, upstream: UpstreamState):
    server, sink = budget_proxy
    spent, other = external_rollout(upstream, max_steps=1), external_rollout(upstream, max_steps=1)
    body = CALLS["chat"][1]
    assert send(chat_url(server, spent.proxy_token), body=body).status == 200
    assert send(chat_url(server, spent.proxy_token), body=body).status == 403

    assert send(chat_url(server, other.proxy_token), body=body).status == 200, "another attempt has its own"
    assert close_and_count_admitted(spent.proxy_token) == GateCount(admitted=1, refused=1)
    late = send(chat_url(server, spent.proxy_token), body=body)
    assert late.status == 401 and late.json()["error"]["code"] == "invalid_token"


def test_the_built_in_harness_counts_its_own_turns_and_is_not_limited_at_the_proxy(
    budget_proxy, upstream: UpstreamState
):
    # Its retries of a failed call are calls too: held at the proxy, they would cut its last turns off.
    server, sink = budget_proxy
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1", max_steps=2)
    assert rollout.job.harness == "builtin"

    statuses = [send(chat_url(server, rollout.proxy_token), body=CALLS["chat"][1]).status for _ in range(4)]

    assert statuses == [200] * 4
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=4, refused=0)
