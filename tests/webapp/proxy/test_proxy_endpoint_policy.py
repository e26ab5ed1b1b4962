"""The proxy's side of registered endpoints, against real sockets: it connects to no loopback, link-local or
private address unless the endpoint allows it, never forwards for an endpoint it must refuse, cuts the key
out of anything the upstream echoes, and passes on only the response headers a harness needs."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.webapp.proxy.harness import (
    UPSTREAM_KEY,
    ProxyHarness,
    UpstreamState,
    _chunk,
    _sse,
    new_call_id,
    send,
)
from webapp.proxy.addresses import AddressRefused, address_refusal, guarded_socket
from webapp.proxy.app import REDACTED, Target, _Redactor, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread

BODY = {"model": "scripted-ok", "messages": [{"role": "user", "content": "List the files."}]}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real listening socket on loopback that must never see a connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def assert_nothing_connected(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.accept()


def serve(targets: dict[str, Target]):
    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)

    async def resolve(token: str) -> Target | None:
        return targets.get(token)

    server = serve_in_thread(make_proxy_app(resolve=resolve, sink=sink, upstream_timeout=2.0), shutdown_timeout=0.5)
    return server, sink, records


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_an_endpoint_without_private_network_reaches_nothing_on_loopback(listener, host):
    port = listener.getsockname()[1]
    target = Target("r-1", "t-1", f"http://{host}:{port}/v1", UPSTREAM_KEY, endpoint="sneaky")
    server, sink, records = serve({"tok": target})
    try:
        reply = send(f"{server.base_url}/r/tok/v1/chat/completions", body=BODY, call_id=new_call_id())
        models = send(f"{server.base_url}/r/tok/v1/models", method="GET")
        sink.flush(5)
    finally:
        server.stop()
        sink.close(5)

    assert reply.status == 403 and reply.json()["error"]["code"] == "endpoint_refused"
    message = reply.json()["error"]["message"]
    assert "'sneaky'" in message and "loopback" in message and "allow_private_network" in message
    assert models.status == 403
    assert_nothing_connected(listener)
    [record] = records
    assert (record.error_kind, record.status_code) == ("endpoint_refused", 403)
    assert UPSTREAM_KEY not in record.to_json().decode()


def test_the_same_upstream_is_reached_once_the_endpoint_allows_private_networks(harness: ProxyHarness,
                                                                                 upstream: UpstreamState):
    before = len(upstream.requests)

    refused = send(harness.url("tok-public-only"), body=BODY)
    by_name = send(harness.url("tok-localhost"), body=BODY)
    allowed = send(harness.url("tok-good"), body=BODY)

    assert (refused.status, by_name.status, allowed.status) == (403, 403, 200)
    assert "resolves" not in refused.json()["error"]["message"] and "127.0.0.1" in refused.json()["error"]["message"]
    assert len(upstream.requests) == before + 1, "only the allowed call reached the upstream"


def test_an_endpoint_the_resolver_refused_is_answered_403_and_recorded_without_a_call(harness: ProxyHarness,
                                                                                    upstream: UpstreamState):
    before, call_id = len(upstream.requests), new_call_id()

    reply = send(harness.url("tok-refused"), body=BODY, call_id=call_id)

    assert reply.status == 403 and reply.json()["error"]["code"] == "endpoint_refused"
    assert "key_ref" in reply.json()["error"]["message"]
    assert len(upstream.requests) == before
    [record] = harness.records_for(call_id)
    assert record.error_kind == "endpoint_refused" and record.request == BODY


def test_a_chat_call_to_an_endpoint_speaking_messages_is_translated_not_sent_as_chat(
    harness: ProxyHarness, upstream: UpstreamState
):
    """The endpoint speaks Messages: the call goes to its /messages (this scripted upstream has none, so it
    answers 404), never to /chat/completions, and its 404 reaches the client in the client's protocol."""
    before = len(upstream.requests)
    call_id = new_call_id()

    reply = send(harness.url("tok-messages"), body=BODY, call_id=call_id)

    assert reply.status == 404 and reply.json()["error"]["code"] == "upstream_status"
    assert len(upstream.requests) == before
    [record] = harness.records_for(call_id)
    assert record.upstream_protocol == "messages" and record.error_kind == "upstream_status"
    sent = json.loads(record.raw["upstream"]["request"])
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "List the files."}]}]
    assert UPSTREAM_KEY not in json.dumps(record.to_dict())


def test_a_key_the_upstream_echoes_reaches_neither_the_harness_nor_the_record(harness: ProxyHarness):
    call_id = new_call_id()

    reply = send(harness.url("tok-good"), body={**BODY, "model": "scripted-echo-key"}, call_id=call_id)

    assert reply.status == 200
    assert UPSTREAM_KEY.encode() not in reply.body
    assert reply.json()["choices"][0]["message"]["content"] == f"you sent {REDACTED.decode()}, fine"
    assert all(UPSTREAM_KEY not in value for value in reply.headers.values())
    [record] = harness.records_for(call_id)
    assert UPSTREAM_KEY.encode() not in record.to_json()


def test_a_key_echoed_across_stream_chunks_is_cut_out_of_the_stream_and_the_record(harness: ProxyHarness):
    call_id = new_call_id()

    reply = send(harness.url("tok-good"), body={**BODY, "model": "scripted-echo-key-stream", "stream": True},
                 call_id=call_id)

    expected = (_sse(_chunk({"role": "assistant", "content": "you sent "}))
                + _sse(_chunk({"content": f"{REDACTED.decode()}, fine"}, finish_reason="stop")) + _sse("[DONE]"))
    assert reply.status == 200 and reply.body == expected
    [record] = harness.records_for(call_id)
    assert record.response["choices"][0]["message"]["content"] == f"you sent {REDACTED.decode()}, fine"
    assert UPSTREAM_KEY.encode() not in record.to_json()
    assert "set-cookie" not in {name.lower() for name in reply.headers}


def test_only_the_headers_a_harness_needs_are_passed_on(harness: ProxyHarness):
    reply = send(harness.url("tok-good"), body={**BODY, "model": "scripted-echo-key"})

    names = {name.lower() for name in reply.headers}
    assert not names & {"set-cookie", "x-powered-by", "www-authenticate", "x-debug-auth"}
    assert reply.headers.get("Server") != "gpu-node-7.internal"  # aiohttp names itself; the upstream's stays behind
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.headers["x-ratelimit-remaining-requests"] == "99" and reply.headers["Retry-After"] == "1"
    assert reply.headers["X-Request-Id"] == f"req-{REDACTED.decode()}"


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.10", "private"),
    ("172.20.0.1", "private"), ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("0.0.0.0", "unspecified"), ("100.64.0.1", "special-purpose"), ("224.0.0.1", "multicast"),
    ("::ffff:10.0.0.1", "private (inside ::ffff:a00:1)"), ("fc00::1", "private"),
    ("2002:7f00:1::1", "loopback (inside 2002:7f00:1::1)"),
])
def test_non_public_addresses_are_refused_with_their_reason(address, reason):
    assert address_refusal(address) == reason
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with pytest.raises(AddressRefused, match=reason.split(" ")[0]):
        guarded_socket((family, socket.SOCK_STREAM, 0, "", (address, 443)))


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700::1111", "1.1.1.1", "::ffff:8.8.8.8"])
def test_public_addresses_get_a_socket(address):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = guarded_socket((family, socket.SOCK_STREAM, 0, "", (address, 443)))
    try:
        assert address_refusal(address) is None and sock.family == family
    finally:
        sock.close()


@pytest.mark.parametrize("cut", range(1, len(UPSTREAM_KEY)))
def test_the_redactor_finds_the_key_wherever_a_chunk_boundary_cuts_it(cut):
    data = f'data: {{"content": "a {UPSTREAM_KEY} b"}}\n\n'.encode()
    at = data.index(UPSTREAM_KEY.encode()) + cut
    redactor = _Redactor(UPSTREAM_KEY)

    out = redactor.chunk(data[:at]) + redactor.chunk(data[at:]) + redactor.end()

    assert out == data.replace(UPSTREAM_KEY.encode(), REDACTED)


def test_the_redactor_holds_back_nothing_that_cannot_start_the_key():
    redactor = _Redactor(UPSTREAM_KEY)
    event = json.dumps({"content": "no secrets here"}).encode() + b"\n\n"

    assert redactor.chunk(event) == event and redactor.end() == b""
