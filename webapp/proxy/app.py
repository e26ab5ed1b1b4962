"""The recording proxy: an OpenAI-compatible pass-through that records every chat-completions call.

`make_proxy_app` builds the aiohttp application from injected dependencies, so this module needs no
Django: `resolve(token)` maps the rollout token in the path to a `Target` (where to forward, with which
key), and `sink.put(record)` takes the call record off the request path.

With `confirm(token)` as well, `resolve` may answer from a cache: the call is forwarded at once while
`confirm` checks the token beside it, and nothing reaches the client, and nothing is recorded, until it
has said the token is still good (401 if not, 503 if it could not tell). A check slower than the upstream
costs the difference; one faster than it costs nothing. The price is that a finished rollout's cached
token may have the upstream start on a call whose answer is then withheld (a stream is cut before its
first byte reaches the client).

Routes: `POST /r/{token}/v1/chat/completions`, `GET /r/{token}/v1/models`, `GET /healthz`. An agent is
pointed at the proxy with `OPENAI_BASE_URL=http://<proxy>/r/<token>/v1`; `Target.upstream_base_url` is the
upstream's base URL in the same convention (it includes `/v1`).

What the client gets is what the upstream sent: status, body bytes and headers (less hop-by-hop ones) for
a plain answer, the same bytes chunk by chunk for a stream. Only failures the upstream could not express
itself are the proxy's own: 504 when the upstream is silent for `upstream_timeout` seconds, 502 when it
cannot be reached. The record is handed to the sink after the response has been sent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from time import perf_counter
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from webapp.proxy import jsonfast
from webapp.proxy.recorder import RecordSink
from webapp.proxy.records import CallRecord
from webapp.proxy.sse import assemble_stream

log = logging.getLogger(__name__)

CALL_ID_HEADER = "X-Trove-Call-Id"
_CALL_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Hop-by-hop headers, and the framing headers aiohttp sets itself for the body it sends on.
_NOT_PASSED_ON = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",  # aiohttp's client decodes the body; the client gets it decoded
    }
)


class _CallIds:
    """Call ids unique across processes and restarts, without a system call per call: a random prefix
    per process (drawn again in a forked child) and a counter. On the hot path, a call that releases the
    GIL (os.urandom, as uuid4 does) waits to get it back while the record writer's thread runs."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(10).hex()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}-{next(self._counter):x}"


_call_ids = _CallIds()


@dataclass(frozen=True)
class Target:
    """Where a rollout's calls go. The key is never logged, shown in a repr or recorded."""

    rollout_id: str
    trajectory_id: str
    upstream_base_url: str
    upstream_api_key: str = field(default="", repr=False)
    model_override: str | None = None


Resolve = Callable[[str], Awaitable[Target | None]]
Confirm = Callable[[str], Awaitable[bool]]  # True: the token is still good (raises: cannot tell)


def make_proxy_app(
    *,
    resolve: Resolve,
    sink: RecordSink,
    confirm: Confirm | None = None,
    connector_limit: int = 512,
    upstream_timeout: float = 600.0,
    connect_timeout: float = 10.0,
    max_body_bytes: int = 64 * 1024 * 1024,
) -> web.Application:
    """The proxy application.

    `upstream_timeout` bounds the upstream's silence (waiting for its answer, or between two chunks of a
    stream), not a whole generation, so a long stream that keeps sending is never cut.
    `connector_limit` caps the pooled upstream connections.
    """
    proxy = _Proxy(
        resolve=resolve,
        confirm=confirm,
        sink=sink,
        connector_limit=connector_limit,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=upstream_timeout, sock_connect=connect_timeout, sock_read=upstream_timeout
        ),
    )
    app = web.Application(client_max_size=max_body_bytes)
    app.cleanup_ctx.append(proxy.client_session)
    app.router.add_get("/healthz", proxy.healthz)
    app.router.add_post("/r/{token}/v1/chat/completions", proxy.chat_completions)
    app.router.add_get("/r/{token}/v1/models", proxy.models)
    return app


class _Proxy:
    def __init__(
        self,
        *,
        resolve: Resolve,
        confirm: Confirm | None,
        sink: RecordSink,
        connector_limit: int,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        self._resolve = resolve
        self._confirm = confirm
        self._sink = sink
        self._connector_limit = connector_limit
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def client_session(self, app: web.Application) -> AsyncIterator[None]:
        # One pooled session for the app's life: created in its loop on startup, closed on cleanup.
        connector = aiohttp.TCPConnector(limit=self._connector_limit, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        yield
        await self._session.close()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _target(self, request: web.Request) -> Target | web.Response:
        """The token's target, or the answer to give instead: 401 for an unknown or finished rollout,
        503 when the resolver cannot tell (its database is down: a client retries a 503, not a 401)."""
        try:
            target = await self._resolve(request.match_info["token"])
        except Exception as exc:
            log.warning("could not resolve a rollout token: %r", exc)
            return _token_check_unavailable()
        return _unknown_token() if target is None else target

    def _admission(self, token: str) -> asyncio.Task[bool] | None:
        """The token's confirmation, started now to run beside the upstream call (None: no confirm)."""
        if self._confirm is None:
            return None
        task = asyncio.ensure_future(self._confirm(token))
        task.add_done_callback(_retrieve_exception)
        return task

    async def models(self, request: web.Request) -> web.StreamResponse:
        """The upstream's model list, passed through; not a model call, so not recorded."""
        target = await self._target(request)
        if isinstance(target, web.Response):
            return target
        refusal = await _refusal(self._admission(request.match_info["token"]))
        if refusal is not None:
            return refusal
        assert self._session is not None
        try:
            async with self._session.get(
                _upstream_url(target, "/models"), headers=_upstream_headers(target, json_body=False)
            ) as upstream:
                body = await upstream.read()
                return web.Response(body=body, status=upstream.status, headers=_passed_on(upstream.headers))
        except TimeoutError:
            return _error_response(504, "upstream_timeout", "the upstream did not answer in time")
        except aiohttp.ClientError as exc:
            return _error_response(502, "upstream_connect", f"the upstream is unreachable: {exc}")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        target = await self._target(request)
        if isinstance(target, web.Response):
            return target
        call_id = request.headers.get(CALL_ID_HEADER)
        if call_id is not None and not _CALL_ID_PATTERN.fullmatch(call_id):
            return _error_response(
                400, "invalid_call_id", f"{CALL_ID_HEADER} must match [A-Za-z0-9._:-]{{1,128}}"
            )
        call = _Call(target=target, call_id=call_id or _call_ids.next())
        call.admission = self._admission(request.match_info["token"])
        try:
            return await self._chat_completions(request, target, call)
        except web.HTTPException as exc:  # a body over the size limit
            call.status = exc.status
            call.fail("invalid_request", exc.reason)
            raise
        except BaseException as exc:
            call.fail("proxy_error", f"the proxy failed: {exc!r}")
            raise
        finally:
            self._record(call)

    async def _chat_completions(
        self, request: web.Request, target: Target, call: _Call
    ) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = jsonfast.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            response = call.fail_locally(400, "invalid_request", "the request body must be a JSON object")
            return await _send(request, response, call)
        call.request = body
        if target.model_override:
            body["model"] = target.model_override
            raw = jsonfast.dumps(body)
        return await self._forward_chat(request, target, raw, call)

    async def _forward_chat(
        self, request: web.Request, target: Target, raw: bytes, call: _Call
    ) -> web.StreamResponse:
        assert self._session is not None
        try:
            async with self._session.post(
                _upstream_url(target, "/chat/completions"), data=raw, headers=_upstream_headers(target)
            ) as upstream:
                call.status = upstream.status
                if upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return await _relay_stream(request, upstream, call)
                call.body = await upstream.read()
                response = web.Response(
                    body=call.body, status=upstream.status, headers=_passed_on(upstream.headers)
                )
        except TimeoutError as exc:
            response = call.fail_locally(504, "upstream_timeout", self._timeout_message(exc))
        except aiohttp.ClientError as exc:
            response = call.fail_locally(502, "upstream_connect", f"the upstream is unreachable: {exc}")
        return await _send(request, response, call)

    def _timeout_message(self, exc: TimeoutError) -> str:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return f"could not connect to the upstream within {self._timeout.sock_connect}s"
        return f"the upstream sent nothing for {self._timeout.sock_read}s"

    def _record(self, call: _Call) -> None:
        """Hand the record to the sink once the call is known to be the rollout's (a refused call is not)."""
        try:
            record = call.to_record()
        except Exception:  # the answer is already with the client; a recording bug must not undo it
            log.exception("could not record call %s", call.call_id)
            return
        admission = call.admission
        if admission is None or admission.done():
            self._put_if_admitted(admission, record)
        else:  # the handler failed before its gate: record once the confirmation is in
            admission.add_done_callback(lambda done: self._put_if_admitted(done, record))

    def _put_if_admitted(self, admission: asyncio.Task[bool] | None, record: CallRecord) -> None:
        if admission is not None and (admission.cancelled() or admission.exception() or not admission.result()):
            return
        try:
            self._sink.put(record)
        except Exception:
            log.exception("could not record call %s", record.call_id)


async def _relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse, call: _Call
) -> web.StreamResponse:
    """Write the upstream's stream to the client as it arrives, keeping each chunk for the record."""
    call.stream = True
    refusal = await _refusal(call.admission)
    if refusal is not None:  # not one byte of a refused call's stream reaches the client
        return await _send(request, refusal, call)
    response = web.StreamResponse(status=upstream.status, headers=_passed_on(upstream.headers))
    try:
        await response.prepare(request)
    except ConnectionError:
        call.fail("client_disconnected", "the client went away before the stream started")
        return response
    while True:
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            call.fail("stream_broken", f"the upstream stream broke: {exc!r}")
            _drop_connection(request)
            return response
        if not chunk:
            break
        call.arrivals.append(perf_counter())
        call.chunks.append(chunk)
        try:
            await response.write(chunk)
        except ConnectionError:
            call.fail("client_disconnected", "the client went away during the stream")
            return response
    return await _send(request, response, call)


def _drop_connection(request: web.Request) -> None:
    # The upstream broke its stream; break ours the same way (no clean end of the chunked body), so
    # the client sees the failure it would have seen talking to the upstream directly.
    if request.transport is not None:
        request.transport.close()


async def _send(request: web.Request, response: web.StreamResponse, call: _Call) -> web.StreamResponse:
    """Finish sending the response now, so the record is made after the client has its answer; a refused
    call's answer is replaced by the refusal."""
    if not response.prepared:
        response = await _refusal(call.admission) or response
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        call.fail("client_disconnected", "the client went away before the answer was delivered")
    return response


@dataclass(eq=False)
class _Call:
    """What the handler learns about one call; becomes a CallRecord once the answer is sent."""

    target: Target
    call_id: str
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=perf_counter)
    request: dict[str, Any] = field(default_factory=dict)
    status: int = 0
    body: bytes = b""
    stream: bool = False
    chunks: list[bytes] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    local_error_body: dict[str, Any] | None = None
    admission: asyncio.Task[bool] | None = None  # the token's confirmation, when one was asked for

    def fail(self, kind: str, message: str) -> None:
        if self.error is None:  # the first failure is the cause; later ones follow from it
            self.error_kind, self.error = kind, message

    def fail_locally(self, status: int, kind: str, message: str) -> web.Response:
        """The proxy answers for the upstream: an OpenAI-style error body, recorded as the response."""
        self.status = status
        self.fail(kind, message)
        self.local_error_body = _error_body(kind, message)
        return web.json_response(self.local_error_body, status=status)

    def to_record(self) -> CallRecord:
        ended_at = datetime.now(UTC)
        latency_ms = (perf_counter() - self.started) * 1000.0
        response, ttft_ms = self._response()
        usage = response.get("usage") if response else None
        return CallRecord(
            call_id=self.call_id,
            rollout_id=self.target.rollout_id,
            trajectory_id=self.target.trajectory_id,
            started_at=self.started_at,
            ended_at=ended_at,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            request=self.request,
            response=response,
            status_code=self.status,
            usage=usage if isinstance(usage, dict) else None,
            error=self.error,
            error_kind=self.error_kind,
            stream=self.stream,
        )

    def _response(self) -> tuple[dict[str, Any] | None, float | None]:
        if self.local_error_body is not None:
            return self.local_error_body, None
        if self.stream:
            assembled = assemble_stream(self.chunks, self.arrivals, self.started)
            if assembled.error:
                self.fail("malformed_stream", assembled.error)
            return assembled.body, assembled.ttft_ms
        return self._parsed_body(), None

    def _parsed_body(self) -> dict[str, Any] | None:
        try:
            body = jsonfast.loads(self.body) if self.body else None
        except ValueError:
            body = None
        if self.status >= 400:
            self.fail("upstream_status", _upstream_error_message(self.status, body, self.body))
        elif not isinstance(body, dict):
            self.fail("malformed_body", f"the upstream body is not a JSON object: {self.body[:200]!r}")
        return body if isinstance(body, dict) else None


def _upstream_error_message(status: int, body: Any, raw: bytes) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"upstream {status}: {error['message']}"
    if isinstance(error, str):
        return f"upstream {status}: {error}"
    return f"upstream {status}: {raw[:200].decode('utf-8', errors='replace')}"


def _upstream_url(target: Target, path: str) -> str:
    return target.upstream_base_url.rstrip("/") + path


def _upstream_headers(target: Target, *, json_body: bool = True) -> dict[str, str]:
    headers = {"Content-Type": "application/json"} if json_body else {}
    if target.upstream_api_key:
        headers["Authorization"] = f"Bearer {target.upstream_api_key}"
    return headers


def _passed_on(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((key, value) for key, value in headers.items() if key.lower() not in _NOT_PASSED_ON)


def _error_body(code: str, message: str, *, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _error_response(status: int, code: str, message: str, *, error_type: str = "proxy_error") -> web.Response:
    return web.json_response(_error_body(code, message, error_type=error_type), status=status)


async def _refusal(admission: asyncio.Task[bool] | None) -> web.Response | None:
    """None when the call may be answered (no confirmation asked, or it said yes), else the refusal."""
    if admission is None:
        return None
    try:
        admitted = await asyncio.shield(admission)  # a client gone mid-wait must not cancel it: _record waits
    except Exception as exc:
        log.warning("could not confirm a rollout token: %r", exc)
        return _token_check_unavailable()
    return None if admitted else _unknown_token()


def _retrieve_exception(task: asyncio.Task[bool]) -> None:
    if not task.cancelled():
        task.exception()  # logged where it is awaited; this only keeps asyncio from warning about it


def _token_check_unavailable() -> web.Response:
    return _error_response(503, "token_check_unavailable", "the proxy cannot check the rollout token right now")


def _unknown_token() -> web.Response:
    return _error_response(
        401, "invalid_token", "unknown or expired rollout token", error_type="authentication_error"
    )
