"""A rollout's calls reach the model as its job's model, whatever model the harness names: the Trove-wired
proxy (tokens looked up in Postgres) forces the job's model_name in every protocol, in the body or, for
Gemini, in the upstream URL's path; the stored step shows the forced model, its raw exchange what the
harness sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from experience.models import Step
from experience.services.stored import stored_step_records
from tests.webapp.proxy.protocol_harness import BASE_SUFFIX, CALL_PATHS, STREAM_PATHS, new_call_id, post
from tests.webapp.proxy.rollouts import running_rollout
from tests.webapp.proxy.test_protocol_translation import BODIES, CLAUDE_HEADERS
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import ProxyServer, serve_in_thread
from webapp.proxy.tokens import TokenResolver
from webapp.proxy.wiring import make_trove_proxy_app
from workers.demo.model import make_app as make_demo_app

pytestmark = pytest.mark.django_db(transaction=True)
JOB_MODEL = "scripted-ok"  # what running_rollout's job names
HARNESS_MODELS = {"chat": "m", "responses": "gpt-5-codex", "messages": "claude-sonnet", "gemini": "demo"}


@dataclass
class Seen:
    """What reached the upstream: each request's path and JSON body."""

    url: str = ""
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    raw_bodies: list[bytes] = field(default_factory=list)


@pytest.fixture(scope="module")
def seen_upstream() -> Iterator[Seen]:
    """The demo model (all four protocols) behind a relay that notes what it was sent."""
    demo = serve_in_thread(make_demo_app(), shutdown_timeout=0.5)
    seen = Seen()

    async def relay(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen.requests.append((request.path, json.loads(raw)))
        seen.raw_bodies.append(raw)
        async with aiohttp.ClientSession() as session, session.post(
            demo.base_url + request.path_qs, data=raw, headers={"Content-Type": "application/json"}
        ) as answer:
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": answer.headers["Content-Type"]})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", relay)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    seen.url = server.base_url
    yield seen
    server.stop()
    demo.stop()


@pytest.fixture
def trove_proxy(settings, tmp_path) -> Iterator[tuple[ProxyServer, InProcessSink]]:
    settings.REDIS_URL = None  # the embedded default: the proxy writes to the database itself
    settings.TROVE_PROXY_SPOOL_DIR = tmp_path / "spool"
    app, sink = make_trove_proxy_app(resolver=TokenResolver())
    assert isinstance(sink, InProcessSink)
    server = serve_in_thread(app, shutdown_timeout=0.5)
    yield server, sink
    server.stop()
    sink.close(10)


@pytest.mark.parametrize(("client", "endpoint", "stream"), [
    ("chat", "chat", True), ("responses", "responses", True), ("messages", "messages", True),
    ("gemini", "gemini", False), ("gemini", "gemini", True), ("messages", "chat", False), ("responses", "gemini", True),
])
def test_a_harness_naming_another_model_reaches_the_upstream_as_the_jobs_model_and_is_recorded_so(
    trove_proxy, seen_upstream: Seen, client: str, endpoint: str, stream: bool
):
    server, sink = trove_proxy
    rollout = running_rollout(endpoint=make_endpoint(seen_upstream.url + BASE_SUFFIX[endpoint], protocol=endpoint,
                                                     model_names=[JOB_MODEL]))
    body = {**BODIES[client](1), "stream": stream} if client != "gemini" else BODIES[client](1)
    path = (STREAM_PATHS if stream else CALL_PATHS)[client]
    call_id = new_call_id()
    before = len(seen_upstream.requests)

    reply = post(f"{server.base_url}/r/{rollout.proxy_token}/{path}", body, call_id=call_id,
                 headers=CLAUDE_HEADERS if client == "messages" else None)
    sink.flush(10)

    assert reply.status == 200, reply.body[:300]
    [(upstream_path, upstream_body)] = seen_upstream.requests[before:]
    if endpoint == "gemini":
        assert upstream_path.endswith(f"/models/{JOB_MODEL}:{'streamGenerateContent' if stream else 'generateContent'}")
        assert "model" not in upstream_body
    else:
        assert upstream_body["model"] == JOB_MODEL
    assert HARNESS_MODELS[client] not in (upstream_path, upstream_body.get("model"))
    [step] = stored_step_records(list(Step.objects.filter(trajectory_id=rollout.trajectory_id, call_id=call_id)))
    assert step.payload["params"]["model"] == JOB_MODEL
    if client != "chat":  # what the harness sent is kept for replay (a chat request is recorded as forced)
        sent = json.loads(step.response_json["raw_exchange"]["request"])
        assert sent == body and sent.get("model") == (None if client == "gemini" else HARNESS_MODELS[client])


@pytest.mark.parametrize("client", ["chat", "responses", "messages"])
def test_a_body_already_naming_the_jobs_model_reaches_the_upstream_byte_for_byte(
    trove_proxy, seen_upstream: Seen, client: str
):
    server, sink = trove_proxy
    rollout = running_rollout(endpoint=make_endpoint(seen_upstream.url + BASE_SUFFIX[client], protocol=client,
                                                     model_names=[JOB_MODEL]))
    body = {**BODIES[client](1), "model": JOB_MODEL}
    raw = json.dumps(body, indent=1).encode()  # spacing the proxy's own serialiser would not keep
    before = len(seen_upstream.raw_bodies)

    reply = post(f"{server.base_url}/r/{rollout.proxy_token}/{CALL_PATHS[client]}", raw=raw, call_id=new_call_id(),
                 headers=CLAUDE_HEADERS if client == "messages" else None)
    sink.flush(10)

    assert reply.status == 200, reply.body[:300]
    assert seen_upstream.raw_bodies[before:] == [raw]
