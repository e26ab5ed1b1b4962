"""A scripted stand-in for a model server (a real aiohttp server on loopback), the proxy in front of it,
and a raw HTTP client. The upstream picks its behaviour from the request's `model`."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp import web
from django.conf import settings as django_settings
from multidict import CIMultiDict

from tests.redis_keys import forget_stream, unique_stream
from webapp.proxy.app import CALL_ID_HEADER, Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import ProxyServer, serve_in_thread

UPSTREAM_KEY = "sk-upstream-secret-do-not-record"
PROXY_TIMEOUT_S = 1.0

OK_BODY = {
    "id": "chatcmpl-ok",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "scripted-ok",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ls -la"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _chunk(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": 1700000001,
        "model": "scripted-stream",
        "choices": [{"index": 0, "delta": delta, **choice}],
    }


def stream_events() -> list[bytes]:
    """The SSE bytes the scripted stream sends, as its chunks (some split mid-line and mid-character)."""
    usage = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    events = b"".join(
        [
            b": keep-alive comment\n\n",
            _sse(_chunk({"role": "assistant", "content": ""}, finish_reason=None)),
            _sse(
                _chunk(
                    {"content": "Caf\u00e9 "},
                    logprobs={"content": [{"token": "Caf", "logprob": -0.1}]},
                    token_ids=[101, 102],
                )
            ),
            _sse(
                _chunk(
                    {"content": "time"},
                    logprobs={"content": [{"token": "time", "logprob": -0.2}]},
                    token_ids=[103],
                )
            ),
            _sse(
                _chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "bash", "arguments": '{"cmd": '},
                            }
                        ]
                    }
                )
            ),
            _sse(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"pytest -q"}'}}]})),
            _sse(_chunk({}, finish_reason="tool_calls")),
            _sse({**_chunk({}), "choices": [], "usage": usage}),
            _sse("[DONE]"),
        ]
    )
    # Cut at fixed offsets, one of them inside the two-byte "é", so reassembly is exercised.
    accent = events.index("\u00e9".encode()) + 1
    cuts = sorted({0, 7, 40, accent, len(events) // 2, len(events) - 5, len(events)})
    return [events[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


@dataclass
class UpstreamState:
    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)


def make_upstream_app(state: UpstreamState) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        state.requests.append({"headers": dict(request.headers), "raw": raw, "body": body})
        # Any other model is answered the way a real server would: streamed when the request asks for it
        # (the proxy forces a job's model, so a rollout's calls arrive as its job's model, scripted-ok).
        return await SCENARIOS.get(body.get("model"), _stream if body.get("stream") else _ok)(request, body)

    async def models(request: web.Request) -> web.Response:
        state.requests.append({"headers": dict(request.headers), "raw": b"", "body": None})
        return web.json_response({"object": "list", "data": [{"id": "scripted-ok", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


async def _ok(request: web.Request, body: dict[str, Any]) -> web.Response:
    return web.json_response({**OK_BODY, "model": body.get("model")}, headers={"X-Request-Id": "req-ok"})


async def _fail_500(request: web.Request, body: dict[str, Any]) -> web.Response:
    error = {"error": {"message": "the model fell over", "type": "server_error", "code": None}}
    return web.json_response(error, status=500)


async def _hang(request: web.Request, body: dict[str, Any]) -> web.Response:
    await asyncio.sleep(PROXY_TIMEOUT_S * 3)
    return web.json_response(OK_BODY)


async def _stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in stream_events():
        await response.write(chunk)
        await asyncio.sleep(0.005)
    await response.write_eof()
    return response


BROKEN_STREAM_PART = _sse(_chunk({"role": "assistant", "content": "half an"})) + b'data: {"id": "chatcmpl-str'


async def _broken_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(BROKEN_STREAM_PART)
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # drop mid-stream: the chunked body never ends
    return response


MALFORMED_STREAM = (
    _sse(_chunk({"role": "assistant", "content": "before "}))
    + b"data: {this is not json\n\n"
    + _sse(_chunk({"content": "after"}, finish_reason="stop"))
    + _sse("[DONE]")
)


async def _malformed_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(MALFORMED_STREAM)
    await response.write_eof()
    return response


async def _slow_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        for i in range(100):
            await response.write(_sse(_chunk({"content": f"word{i} "})))
            await asyncio.sleep(0.02)
    except ConnectionError:
        return response  # the proxy let go once its client had gone
    await response.write_eof()
    return response


def _sent_key(request: web.Request) -> str:
    return request.headers.get("Authorization", "").removeprefix("Bearer ")


ECHO_HEADERS = {"Set-Cookie": "session=abc123; HttpOnly", "Server": "gpu-node-7.internal", "X-Powered-By": "vllm",
                "WWW-Authenticate": 'Bearer realm="internal"', "x-ratelimit-remaining-requests": "99",
                "Retry-After": "1"}


async def _echo_key(request: web.Request, body: dict[str, Any]) -> web.Response:
    """An upstream that quotes the key it was sent (some servers' errors do) and sends headers a harness has
    no business seeing."""
    key = _sent_key(request)
    answer = {**OK_BODY, "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": f"you sent {key}, fine"}}]}
    return web.json_response(answer, headers={**ECHO_HEADERS, "X-Request-Id": f"req-{key}", "X-Debug-Auth": key})


async def _echo_key_stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """The key quoted in a stream, cut across three chunks."""
    key = _sent_key(request).encode()
    events = (_sse(_chunk({"role": "assistant", "content": "you sent "}))
              + _sse(_chunk({"content": f"{key.decode()}, fine"}, finish_reason="stop")) + _sse("[DONE]"))
    at = events.index(key)
    cuts = [0, at + 3, at + len(key) // 2, len(events)]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Set-Cookie": "s=1"})
    await response.prepare(request)
    for start, end in zip(cuts, cuts[1:], strict=False):
        await response.write(events[start:end])
        await asyncio.sleep(0.005)
    await response.write_eof()
    return response


SCENARIOS = {
    "scripted-echo-key": _echo_key,
    "scripted-echo-key-stream": _echo_key_stream,
    "scripted-slow-stream": _slow_stream,
    "scripted-500": _fail_500,
    "scripted-hang": _hang,
    "scripted-stream": _stream,
    "scripted-broken": _broken_stream,
    "scripted-malformed": _malformed_stream,
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamState]:
    state = UpstreamState()
    server = serve_in_thread(make_upstream_app(state), shutdown_timeout=0.5)
    state.url = server.base_url
    yield state
    server.stop()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ProxyHarness:
    server: ProxyServer
    sink: InProcessSink
    records: list[CallRecord]

    def url(self, token: str, path: str = "v1/chat/completions") -> str:
        return f"{self.server.base_url}/r/{token}/{path}"

    def records_for(self, call_id: str, *, count: int = 1, timeout: float = 5.0) -> list[CallRecord]:
        """Wait for `count` records of the call: the proxy records after the client has its answer."""
        deadline = time.monotonic() + timeout
        while True:
            self.sink.flush(timeout)
            found = [record for record in self.records if record.call_id == call_id]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.01)


@pytest.fixture(scope="module")
def harness(upstream: UpstreamState) -> Iterator[ProxyHarness]:
    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)
    upstream_v1 = f"{upstream.url}/v1"
    loopback = {"allow_private_network": True}  # the scripted upstream listens on 127.0.0.1
    targets = {
        "tok-good": Target("rollout-1", "traj-1", upstream_v1, UPSTREAM_KEY, **loopback),
        "tok-override": Target(
            "rollout-2", "traj-2", upstream_v1, UPSTREAM_KEY, model_override="served-model", **loopback
        ),
        "tok-unreachable": Target(
            "rollout-3", "traj-3", f"http://127.0.0.1:{closed_port()}/v1", UPSTREAM_KEY, **loopback
        ),
        # The same upstream, for an endpoint registered without allow_private_network.
        "tok-public-only": Target("rollout-4", "traj-4", upstream_v1, UPSTREAM_KEY, endpoint="public-only"),
        "tok-localhost": Target("rollout-5", "traj-5", upstream_v1.replace("127.0.0.1", "localhost"), UPSTREAM_KEY,
                                endpoint="by-name"),
        "tok-refused": Target("rollout-6", "traj-6", upstream_v1, UPSTREAM_KEY, endpoint="keyless",
                              refusal="endpoint 'keyless' cannot be used: key_ref: the variable X is not set", **loopback),
        "tok-messages": Target("rollout-7", "traj-7", upstream_v1, UPSTREAM_KEY, endpoint="claude", protocol="messages",
                               **loopback),
    }

    async def resolve(token: str) -> Target | None:
        return targets.get(token)

    app = make_proxy_app(resolve=resolve, sink=sink, upstream_timeout=PROXY_TIMEOUT_S)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    yield ProxyHarness(server, sink, records)
    server.stop()
    sink.close()


@dataclass
class Reply:
    status: int
    headers: CIMultiDict[str]
    body: bytes
    chunks: list[bytes]
    broken: bool  # the body ended without its proper end (connection dropped)

    def json(self) -> Any:
        return json.loads(self.body)


def new_call_id() -> str:
    return f"test-{uuid.uuid4().hex}"


def read_first_chunk_and_hang_up(url: str, *, body: dict[str, Any], call_id: str) -> bytes:
    async def go() -> bytes:
        async with aiohttp.ClientSession() as session:
            response = await session.post(url, json=body, headers={CALL_ID_HEADER: call_id})
            first = await response.content.readany()
            response.close()  # drops the connection mid-stream
            return first

    return asyncio.run(go())


def send(
    url: str,
    *,
    method: str = "POST",
    body: dict[str, Any] | None = None,
    raw: bytes | None = None,
    call_id: str | None = None,
    unix_path: str | None = None,
) -> Reply:
    headers = {"Content-Type": "application/json"}
    if call_id is not None:
        headers[CALL_ID_HEADER] = call_id
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)

    async def go() -> Reply:
        connector = aiohttp.UnixConnector(unix_path) if unix_path else None
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.request(method, url, data=data, headers=headers) as response:
                chunks: list[bytes] = []
                broken = False
                try:
                    async for chunk in response.content.iter_any():
                        chunks.append(chunk)
                except aiohttp.ClientPayloadError:
                    broken = True
                return Reply(response.status, CIMultiDict(response.headers), b"".join(chunks), chunks, broken)

    return asyncio.run(go())


@pytest.fixture
def redis_client(run_redis) -> Iterator[redis.Redis]:
    """A client of the tests' Redis db (REDIS_URL), never another's."""
    if run_redis is None:
        pytest.fail("the Redis stream tests need REDIS_URL: run them with `make test`")
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def stream_name(redis_client: redis.Redis) -> Iterator[str]:
    name = unique_stream("proxy")
    yield name
    forget_stream(redis_client, name)
