"""A real proxy in front of real upstreams on loopback for the protocol tests: the demo model (which speaks
all four protocols) and a scripted upstream that replays fixed bytes or fails on purpose, one token per
(client protocol, endpoint protocol, upstream) pairing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from webapp.proxy.app import CALL_ID_HEADER, Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread
from workers.demo.model import make_app as make_demo_app

PROTOCOLS = ("chat", "responses", "messages", "gemini")
UPSTREAM_KEY = "sk-protocol-upstream-secret"
PROXY_TIMEOUT_S = 1.0
# Where each protocol's calls go under a token, and the base URL convention of an endpoint speaking it.
CALL_PATHS = {"chat": "v1/chat/completions", "responses": "v1/responses", "messages": "v1/messages?beta=true",
              "gemini": "v1beta/models/demo:generateContent"}
STREAM_PATHS = {**CALL_PATHS, "gemini": "v1beta/models/demo:streamGenerateContent?alt=sse"}
BASE_SUFFIX = {"chat": "/v1", "responses": "/v1", "messages": "/v1", "gemini": "/v1beta"}


@dataclass
class Scripted:
    """What the scripted upstream does next, and what it was sent."""

    mode: str = "replay"  # replay | 500 | hang | malformed
    body: bytes = b""  # the bytes to replay
    chunks: list[bytes] = field(default_factory=list)  # or, for a stream, these chunks one by one
    content_type: str = "application/json"
    requests: list[dict[str, Any]] = field(default_factory=list)


def make_scripted_app(state: Scripted) -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        state.requests.append({"path": request.path_qs, "headers": dict(request.headers), "raw": await request.read()})
        if state.mode == "500":
            return web.json_response({"error": {"message": "the model server exploded", "type": "server_error"}},
                                     status=500)
        if state.mode == "hang":
            await asyncio.sleep(3600)
        if state.mode == "malformed":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: {not json\n\n")
            await response.write_eof()
            return response
        if not state.chunks:
            return web.Response(body=state.body, content_type=state.content_type)
        response = web.StreamResponse(headers={"Content-Type": state.content_type})
        await response.prepare(request)
        for chunk in state.chunks:
            await response.write(chunk)
            await asyncio.sleep(0.002)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", answer)
    return app


@dataclass
class ProtocolProxy:
    base_url: str
    demo_url: str  # the demo model's root
    sink: InProcessSink
    records: list[CallRecord]
    scripted: Scripted

    def url(self, client: str, endpoint: str, upstream: str = "demo", *, stream: bool = False) -> str:
        path = (STREAM_PATHS if stream else CALL_PATHS)[client]
        return f"{self.base_url}/r/{token(client, endpoint, upstream)}/{path}"

    def record(self, call_id: str, timeout: float = 5.0) -> CallRecord:
        deadline = time.monotonic() + timeout
        while True:
            self.sink.flush(timeout)
            found = [r for r in self.records if r.call_id == call_id]
            if found or time.monotonic() > deadline:
                assert len(found) == 1, f"{len(found)} records for {call_id}"
                return found[0]
            time.sleep(0.01)


def token(client: str, endpoint: str, upstream: str) -> str:
    return f"tok-{client}-{endpoint}-{upstream}"


@pytest.fixture(scope="module")
def protocol_proxy() -> Iterator[ProtocolProxy]:
    demo = serve_in_thread(make_demo_app(), shutdown_timeout=0.5)
    scripted = Scripted()
    scripted_server = serve_in_thread(make_scripted_app(scripted), shutdown_timeout=0.5)
    targets = {}
    for client in PROTOCOLS:
        for endpoint in PROTOCOLS:
            for upstream, root in (("demo", demo.base_url), ("scripted", scripted_server.base_url)):
                targets[token(client, endpoint, upstream)] = Target(
                    f"rollout-{client}-{endpoint}", f"traj-{client}-{endpoint}", root + BASE_SUFFIX[endpoint],
                    UPSTREAM_KEY, endpoint=f"{upstream}-{endpoint}", protocol=endpoint, allow_private_network=True)

    async def resolve(value: str) -> Target | None:
        return targets.get(value)

    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)
    proxy = serve_in_thread(make_proxy_app(resolve=resolve, sink=sink, upstream_timeout=PROXY_TIMEOUT_S),
                            shutdown_timeout=0.5)
    yield ProtocolProxy(proxy.base_url, demo.base_url, sink, records, scripted)
    proxy.stop()
    sink.close()
    scripted_server.stop()
    demo.stop()


@dataclass
class Reply:
    status: int
    headers: CIMultiDict[str]
    body: bytes
    broken: bool

    def json(self) -> Any:
        return json.loads(self.body)


def post(url: str, body: dict[str, Any] | None = None, *, raw: bytes | None = None, method: str = "POST",
         headers: dict[str, str] | None = None, call_id: str | None = None) -> Reply:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if call_id:
        sent[CALL_ID_HEADER] = call_id
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)

    async def go() -> Reply:
        async with aiohttp.ClientSession() as session, session.request(method, url, data=data, headers=sent) as response:
            chunks, broken = [], False
            try:
                async for chunk in response.content.iter_any():
                    chunks.append(chunk)
            except aiohttp.ClientPayloadError:
                broken = True
            return Reply(response.status, CIMultiDict(response.headers), b"".join(chunks), broken)

    return asyncio.run(go())


def new_call_id() -> str:
    return f"proto-{uuid.uuid4().hex}"


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith("data:")]
        if data and data[0] != "[DONE]":
            out.append(json.loads("\n".join(data)))
    return out
