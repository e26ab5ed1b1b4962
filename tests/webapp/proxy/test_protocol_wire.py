"""Per protocol, through the real proxy: a stream reaches the client byte for byte as the upstream sent it
(a stream the demo model produced, replayed by a scripted upstream in odd-sized chunks); and 5xx, hanging
and malformed upstreams give the answers and error records they give for chat, in the client's protocol,
passed through or translated."""

from __future__ import annotations

import json

import pytest

from tests.webapp.proxy.protocol_harness import (
    PROTOCOLS,
    STREAM_PATHS,
    UPSTREAM_KEY,
    ProtocolProxy,
    new_call_id,
    post,
    token,
)
from tests.webapp.proxy.test_protocol_translation import BODIES, CLAUDE_HEADERS


def _stream_body(protocol: str) -> dict:
    return BODIES[protocol](1)


def _demo_stream(proxy: ProtocolProxy, protocol: str) -> bytes:
    """The stream the demo model sends for this protocol's conversation, fetched from it directly."""
    path = STREAM_PATHS[protocol].split("?")[0] + ("?alt=sse" if protocol == "gemini" else "")
    reply = post(f"{proxy.demo_url}/{path}", _stream_body(protocol))
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    return reply.body


def _odd_chunks(data: bytes) -> list[bytes]:
    """Cut where events do not end (mid-line, mid-UTF-8 is fine: the proxy relays bytes)."""
    cuts = list(range(0, len(data), 37)) + [len(data)]
    return [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def _url(proxy: ProtocolProxy, protocol: str, endpoint: str | None = None) -> str:
    return f"{proxy.base_url}/r/{token(protocol, endpoint or protocol, 'scripted')}/{STREAM_PATHS[protocol]}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stream_reaches_the_client_byte_identical_and_is_recorded_normalised(
    protocol_proxy: ProtocolProxy, protocol: str
):
    sent = _demo_stream(protocol_proxy, protocol)
    scripted = protocol_proxy.scripted
    scripted.mode, scripted.chunks, scripted.content_type = "replay", _odd_chunks(sent), "text/event-stream"
    call_id = new_call_id()

    reply = post(_url(protocol_proxy, protocol), _stream_body(protocol), call_id=call_id,
                 headers=CLAUDE_HEADERS if protocol == "messages" else None)

    assert reply.status == 200 and reply.body == sent
    record = protocol_proxy.record(call_id)
    assert not record.is_error and record.stream and record.ttft_ms is not None
    message = record.response["choices"][0]["message"]
    assert message["tool_calls"] and message["content"]
    assert record.raw is not None and record.raw["response"].encode() == sent
    assert UPSTREAM_KEY not in json.dumps(record.to_dict())


FAULT_STATUS = {"500": 500, "hang": 504}


@pytest.mark.parametrize("mode", ["500", "hang", "malformed"])
@pytest.mark.parametrize("endpoint_kind", ["same", "chat"])
@pytest.mark.parametrize("protocol", ["responses", "messages", "gemini"])
def test_failing_upstreams_per_protocol(protocol_proxy: ProtocolProxy, protocol: str, endpoint_kind: str, mode: str):
    endpoint = protocol if endpoint_kind == "same" else "chat"
    protocol_proxy.scripted.mode = mode
    call_id = new_call_id()
    try:
        reply = post(_url(protocol_proxy, protocol, endpoint), _stream_body(protocol), call_id=call_id)
    finally:
        protocol_proxy.scripted.mode = "replay"
    record = protocol_proxy.record(call_id)

    assert record.is_error and record.protocol == protocol and record.upstream_protocol == endpoint
    step = record.to_step_record()
    assert step.is_error and step.kind == "model_call"
    if mode == "malformed":
        assert reply.status == 200 and record.error_kind == "malformed_stream"
        return
    assert reply.status == FAULT_STATUS[mode]
    assert record.error_kind == ("upstream_status" if mode == "500" else "upstream_timeout")
    error = reply.json()
    if mode == "500" and endpoint_kind == "same":  # passed through: the upstream's own body, as it sent it
        assert error == {"error": {"message": "the model server exploded", "type": "server_error"}}
        return
    if protocol == "messages":  # the proxy's own answers (and translated ones) speak the client's protocol
        assert error["type"] == "error" and error["error"]["message"]
    else:
        assert error["error"]["message"]
    if mode == "500" and endpoint_kind == "chat":  # translated: the upstream's message in the client's shape
        assert "exploded" in json.dumps(error)
