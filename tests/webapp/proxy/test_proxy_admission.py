"""The proxy's count of the calls it admits per rollout attempt, and the gate its runner closes when the
harness has exited (webapp/proxy/admission.py): full stack only (Redis), a real Postgres, the proxy served
on loopback, the scripted upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings

from tests.webapp.proxy.harness import PROXY_TIMEOUT_S, UpstreamState, new_call_id, send
from tests.webapp.proxy.rollouts import chat_url, running_rollout, stored_call_ids
from webapp.proxy.admission import GateCount
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.wiring import close_and_count_admitted, database_sink, make_trove_proxy_app

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not django_settings.REDIS_URL, reason="admission is counted in Redis")]
BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}


def serve(settings, tmp_path) -> tuple[ProxyServer, InProcessSink]:
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    sink = database_sink()  # records straight to the database: what is stored is known at flush
    app, _ = make_trove_proxy_app(sink=sink, upstream_timeout=PROXY_TIMEOUT_S)
    return serve_in_thread(app, shutdown_timeout=0.5), sink


@pytest.fixture
def counting_proxy(settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    server, sink = serve(settings, tmp_path)
    yield server, sink
    server.stop()
    sink.close(10)


def test_every_admitted_call_is_counted_by_call_id_and_after_the_gate_closes_none_is_admitted_or_recorded(
    counting_proxy, upstream: UpstreamState
):
    server, sink = counting_proxy
    rollout, successor = running_rollout(upstream_v1=f"{upstream.url}/v1"), running_rollout(
        upstream_v1=f"{upstream.url}/v1")
    first, second = new_call_id(), new_call_id()
    for call_id in (first, second, first):  # a repeated call id is one step in the store, so one call
        assert send(chat_url(server, rollout.proxy_token), body=BODY, call_id=call_id).status == 200
    refused = send(chat_url(server, rollout.proxy_token), raw=b"[1]", call_id=new_call_id())
    assert refused.status == 400  # admitted, answered by the proxy, recorded: counted

    assert close_and_count_admitted(rollout.proxy_token) == GateCount(admitted=3, refused=0)
    forwarded = len(upstream.requests)
    late = send(chat_url(server, rollout.proxy_token), body=BODY, call_id=new_call_id())
    sink.flush(10)

    assert late.status == 401, "a process the harness left behind cannot sneak a call in after the count"
    assert len(upstream.requests) == forwarded
    assert len(stored_call_ids(rollout)) == 3
    assert close_and_count_admitted(rollout.proxy_token) == GateCount(0, 0), "the count was read once, and nothing since"
    # another attempt (its own token) is not touched by this one's gate
    assert send(chat_url(server, successor.proxy_token), body=BODY, call_id=new_call_id()).status == 200
    assert close_and_count_admitted(successor.proxy_token) == GateCount(1, 0)


def test_while_the_count_cannot_be_kept_a_call_goes_ahead_uncounted_and_is_recorded(
    settings, tmp_path, upstream: UpstreamState
):
    rollout = running_rollout(upstream_v1=f"{upstream.url}/v1")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: Redis is down for the proxy
    server, sink = serve(settings, tmp_path)
    call_id = new_call_id()
    try:
        reply = send(chat_url(server, rollout.proxy_token), body=BODY, call_id=call_id)
        sink.flush(10)
    finally:
        server.stop()
        sink.close(10)

    assert reply.status == 200, "the harness never notices the outage"
    assert set(stored_call_ids(rollout)) == {call_id}
