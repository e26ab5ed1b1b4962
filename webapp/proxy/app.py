"""The recording proxy: a pass-through (or translating) proxy that records every model call, in four protocols.

`make_proxy_app` builds the aiohttp application from injected dependencies, so this module needs no
Django: `resolve(token)` maps the rollout token in the path to a `Target` (where to forward, with which
key, in which protocol), and `sink.put(record)` takes the call record off the request path. `resolve` is
awaited before anything is forwarded: a token it does not know (401) or cannot check (503) makes no
upstream call.

Routes, under `/r/{token}`: `POST /v1/chat/completions` (OpenAI Chat Completions), `POST /v1/responses`
(OpenAI Responses), `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages) with a
`HEAD /` pre-connect, `POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent` (Gemini),
`GET /v1/models`; and `GET /healthz`. Each protocol is a module of webapp/proxy/protocols/. A harness is
pointed at the proxy with its protocol's base URL (`OPENAI_BASE_URL=http://<proxy>/r/<token>/v1`,
`ANTHROPIC_BASE_URL=http://<proxy>/r/<token>`, `GOOGLE_GEMINI_BASE_URL=http://<proxy>/r/<token>`);
`Target.upstream_base_url` is the endpoint's API root its protocol's paths hang off (`.../v1`; Gemini
`.../v1beta`).

When the endpoint speaks the client's protocol, what the client gets is what the upstream sent: status
and body bytes for a plain answer, the same bytes chunk by chunk for a stream, and of the headers only
those its protocol needs (`_PASSED_ON`: no cookies, server internals or auth challenges). When it speaks
another, the call is translated through Chat Completions both ways (a chat stream chunk by chunk; a stream
of another protocol read whole, then written out); a field with no equivalent is answered 400
(`untranslatable`, naming the field) and nothing is sent. The endpoint's key is cut out of anything the
upstream echoes back, before the client or the record sees it. Only failures the upstream could not
express itself are the proxy's own, in the client's protocol: 504 when the upstream is silent for
`upstream_timeout` seconds, 502 when it cannot be reached, 403 (`endpoint_refused`) when the endpoint may
not be used: its key reference is not allowed or not readable, or its address is loopback, link-local or
private without `allow_private_network` (checked on every address a connection uses,
webapp/proxy/addresses.py). The record (normalised to Chat Completions, with the raw bytes beside it) is
handed to the sink after the response has been sent. Before any of that, `admit` counts the call for its
runner and holds the job's step budget (webapp/proxy/admission.py): a call past it is answered 403
(`step_budget_exhausted`, in the client's protocol), not forwarded and not recorded. For a token that resolved
before (`known_budget`), the count and the token's check go out together, and a call the check refuses is taken
back off the count (`unadmit`) before it is answered 401: the call still goes ahead only on a check made after it
arrived, and it costs the longer of the two round trips rather than their sum.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
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
from webapp.proxy.addresses import address_refusal_in, guarded_socket
from webapp.proxy.capture import (
    Capture,
    StreamStripper,
    capture_request,
    policy_version,
    strip_answer,
    strip_fields,
)
from webapp.proxy.protocols import PROTOCOLS, Untranslatable, gemini, messages
from webapp.proxy.protocols.base import SseParser, chunks_of_response, parse_json_event
from webapp.proxy.recorder import RecordSink
from webapp.proxy.records import CallRecord

log = logging.getLogger(__name__)

CALL_ID_HEADER = "X-Trove-Call-Id"
STEP_BUDGET_CODE = "step_budget_exhausted"
_CALL_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The upstream's response headers a harness gets: what its protocol needs (the body's type, request ids,
# the rate-limit and retry hints SDKs act on). Everything else stays behind: cookies, server internals,
# auth challenges, anything that could echo a credential, and the framing aiohttp sets itself for the body
# it sends on (the client gets the body decoded).
_PASSED_ON = frozenset({"content-type", "cache-control", "retry-after", "retry-after-ms", "x-should-retry",
                        "x-request-id", "request-id", "openai-processing-ms", "openai-version"})
_PASSED_ON_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
REDACTED = b"[redacted]"
MIN_REDACTED_KEY = 8  # a shorter "key" would blank out ordinary text; it is no secret worth the name


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
    """Where a rollout's calls go: its job's registered endpoint. The key is never logged, shown in a repr
    or recorded. `refusal`, when set, is why the endpoint may not be used: the call is answered 403 with it.
    Without `allow_private_network` the proxy connects to public addresses only."""

    rollout_id: str
    trajectory_id: str
    upstream_base_url: str
    upstream_api_key: str = field(default="", repr=False)
    model_override: str | None = None
    allow_private_network: bool = False
    endpoint: str = ""
    protocol: str = "chat"
    refusal: str | None = None
    # RL token capture (webapp/proxy/capture.py): the mode (off, vllm, sglang) and where the server names
    # the policy version (header:NAME, body:path, or '').
    token_capture: str = "off"
    policy_version_from: str = ""
    # The job's step budget, held here for a harness that takes no turn limit of its own: the attempt's call
    # max_calls + 1 and later are refused, not forwarded. 0: no limit at the proxy (the built-in harness
    # counts its own turns).
    max_calls: int = 0


class Admission(enum.Enum):
    ADMITTED = "admitted"
    GATE_CLOSED = "gate_closed"  # the attempt's harness has exited: its token admits nothing more
    BUDGET_SPENT = "budget_spent"  # the attempt made its max_calls calls already


Resolve = Callable[[str], Awaitable[Target | None]]
# (token, call id, max calls or 0) -> whether the call may go ahead, counted where its runner reads it
# (admission.py). Raises when the count cannot be kept (the call goes ahead uncounted).
Admit = Callable[[str, str, int], Awaitable[Admission]]
# token -> the step budget it had when it last resolved (None: not known), and (token, call id, max calls) ->
# take back an admitted call that is not forwarded (False: too late, the gate had closed).
KnownBudget = Callable[[str], int | None]
Unadmit = Callable[[str, str, int], Awaitable[bool]]


def make_proxy_app(
    *,
    resolve: Resolve,
    sink: RecordSink,
    admit: Admit | None = None,
    known_budget: KnownBudget | None = None,
    unadmit: Unadmit | None = None,
    connector_limit: int = 512,
    upstream_timeout: float = 600.0,
    connect_timeout: float = 10.0,
    max_body_bytes: int = 64 * 1024 * 1024,
) -> web.Application:
    """The proxy application.

    `upstream_timeout` bounds the upstream's silence (waiting for its answer, or between two chunks of a
    stream), not a whole generation, so a long stream that keeps sending is never cut.
    `connector_limit` caps the pooled upstream connections (per pool: public-only and private-allowed).
    `admit`, when given, is asked before each model call is forwarded (every admitted call is recorded).
    With `known_budget` and `unadmit` too, a call whose token resolved before is admitted while its token is
    checked, and taken back with `unadmit` when the check refuses it (or its client goes first).
    """
    proxy = _Proxy(
        resolve=resolve,
        sink=sink,
        admit=admit,
        known_budget=known_budget,
        unadmit=unadmit,
        connector_limit=connector_limit,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=upstream_timeout, sock_connect=connect_timeout, sock_read=upstream_timeout
        ),
    )
    app = web.Application(client_max_size=max_body_bytes)
    app.cleanup_ctx.append(proxy.client_sessions)
    app.router.add_get("/healthz", proxy.healthz)
    for name, module in PROTOCOLS.items():
        for method, path in module.ROUTES:
            app.router.add_route(method, "/r/{token}" + path, proxy.model_call(name))
    app.router.add_post("/r/{token}/v1/messages/count_tokens", proxy.count_tokens)
    app.router.add_route("HEAD", "/r/{token}/", proxy.preconnect)
    app.router.add_route("HEAD", "/r/{token}", proxy.preconnect)
    app.router.add_get("/r/{token}/v1/models", proxy.models)
    return app


class _Proxy:
    def __init__(
        self,
        *,
        resolve: Resolve,
        sink: RecordSink,
        admit: Admit | None,
        known_budget: KnownBudget | None,
        unadmit: Unadmit | None,
        connector_limit: int,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        self._resolve = resolve
        self._sink = sink
        self._admit = admit
        self._known_budget = known_budget
        self._unadmit = unadmit
        self._taking_back: set[asyncio.Future[None]] = set()
        self._connector_limit = connector_limit
        self._timeout = timeout
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    async def client_sessions(self, app: web.Application) -> AsyncIterator[None]:
        # Two pooled sessions for the app's life, created in its loop on startup, closed on cleanup: one whose
        # sockets refuse non-public addresses (every endpoint without allow_private_network), one without.
        for private_allowed, socket_factory in ((False, guarded_socket), (True, None)):
            connector = aiohttp.TCPConnector(limit=self._connector_limit, limit_per_host=0, ttl_dns_cache=300,
                                             socket_factory=socket_factory)
            self._sessions[private_allowed] = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        yield
        for session in self._sessions.values():
            await session.close()

    def _session(self, target: Target) -> aiohttp.ClientSession:
        return self._sessions[target.allow_private_network]

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

    async def models(self, request: web.Request) -> web.StreamResponse:
        """The upstream's model list, passed through; not a model call, so not recorded."""
        target = await self._target(request)
        if isinstance(target, web.Response):
            return target
        if target.refusal:
            return _error_response(403, "endpoint_refused", target.refusal)
        redactor = _Redactor(target.upstream_api_key)
        try:
            async with self._session(target).get(
                _upstream_url(target, "/models"), headers=_upstream_headers(target, json_body=False),
                allow_redirects=False,
            ) as upstream:
                body = redactor.whole(await upstream.read())
                return web.Response(body=body, status=upstream.status, headers=_passed_on(upstream.headers, redactor))
        except TimeoutError:
            return _error_response(504, "upstream_timeout", "the upstream did not answer in time")
        except aiohttp.ClientError as exc:
            refused = address_refusal_in(exc)
            if refused is not None:
                return _error_response(403, "endpoint_refused", _address_refusal(target, refused))
            return _error_response(502, "upstream_connect", f"the upstream is unreachable: {exc}")

    def model_call(self, protocol: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler of one protocol's model-call route."""

        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._model_call(request, protocol)

        return handle

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._model_call(request, "chat")

    async def preconnect(self, request: web.Request) -> web.Response:
        """Claude Code's `HEAD /` before its first call: answered here (a valid token), nothing forwarded."""
        target = await self._target(request)
        return target if isinstance(target, web.Response) else web.Response(status=200)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        """Messages' token count: passed to a Messages endpoint; for any other an estimate (characters / 4),
        labelled as one in `trove_estimate`. Not a model call, so not recorded."""
        target = await self._target(request)
        if isinstance(target, web.Response):
            return target
        if target.refusal:
            return web.json_response(messages.error_body("endpoint_refused", target.refusal), status=403)
        try:
            body = jsonfast.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response(messages.error_body("invalid_request", "the request body must be a JSON object"),
                                     status=400)
        if target.protocol != "messages":
            return web.json_response({"input_tokens": messages.count_tokens_estimate(body), "trove_estimate": True})
        if target.model_override:
            body["model"] = target.model_override
        redactor = _Redactor(target.upstream_api_key)
        try:
            async with self._session(target).post(
                _upstream_url(target, "/messages/count_tokens"), data=jsonfast.dumps(body),
                headers=_protocol_headers(target, request, messages), allow_redirects=False,
            ) as upstream:
                return web.Response(body=redactor.whole(await upstream.read()), status=upstream.status,
                                    headers=_passed_on(upstream.headers, redactor))
        except TimeoutError:
            return web.json_response(messages.error_body("upstream_timeout", "the upstream did not answer in time"),
                                     status=504)
        except aiohttp.ClientError as exc:
            refused = address_refusal_in(exc)
            if refused is not None:
                return web.json_response(messages.error_body("endpoint_refused", _address_refusal(target, refused)),
                                         status=403)
            return web.json_response(messages.error_body("upstream_connect", f"the upstream is unreachable: {exc}"),
                                     status=502)

    async def _model_call(self, request: web.Request, protocol: str) -> web.StreamResponse:
        admitted = await self._checked_and_admitted(request, protocol)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        call, target = admitted, admitted.target
        # From here on the call is recorded whatever happens (the `finally`): its runner waits for the record.
        try:
            return await self._handle_call(request, target, call)
        except web.HTTPException as exc:  # a body over the size limit
            call.status = exc.status
            call.fail("invalid_request", exc.reason)
            raise
        except BaseException as exc:
            call.fail("proxy_error", f"the proxy failed: {exc!r}")
            raise
        finally:
            self._record(call)

    async def _checked_and_admitted(self, request: web.Request, protocol: str) -> _Call | web.StreamResponse:
        """The call, its token checked and the call admitted; or the answer to give instead. A token that
        resolved here before (its step budget known) is checked and admitted at once, the database and
        Redis asked side by side; any other is checked first. Either way the call goes ahead only if the
        check made after it arrived found a running rollout."""
        token = request.match_info["token"]
        call_id = request.headers.get(CALL_ID_HEADER)
        budget = self._known_budget(token) if self._known_budget is not None and self._unadmit is not None else None
        if (call_id is not None and not _CALL_ID_PATTERN.fullmatch(call_id)) or _is_gemini_count(request, protocol):
            budget = None  # answered without an admission, after the token's check
        if budget is None:
            return await self._checked_then_admitted(request, protocol, call_id)
        call_id = call_id or _call_ids.next()
        counting = self._start_count(token, call_id, budget)
        try:
            target = await self._target(request)
        except asyncio.CancelledError:
            self._take_back(counting, token, call_id, budget)
            raise
        if isinstance(target, web.Response):  # ended or unknown now: what was counted is taken back first
            await asyncio.shield(self._take_back(counting, token, call_id, budget))
            return target
        call = _Call(target=target, call_id=call_id, protocol=protocol)
        refused = await self._counted(call, counting)
        return call if refused is None else refused

    async def _checked_then_admitted(self, request: web.Request, protocol: str,
                                     call_id: str | None) -> _Call | web.StreamResponse:
        target = await self._target(request)
        if isinstance(target, web.Response):
            return target
        if _is_gemini_count(request, protocol):
            return await _gemini_count_tokens(request)
        if call_id is not None and not _CALL_ID_PATTERN.fullmatch(call_id):
            return _error_response(
                400, "invalid_call_id", f"{CALL_ID_HEADER} must match [A-Za-z0-9._:-]{{1,128}}"
            )
        call = _Call(target=target, call_id=call_id or _call_ids.next(), protocol=protocol)
        refused = await self._admission(request, call)
        return call if refused is None else refused

    def _start_count(self, token: str, call_id: str, max_calls: int) -> asyncio.Future[Admission]:
        assert self._admit is not None
        return asyncio.ensure_future(self._admit(token, call_id, max_calls))

    def _take_back(self, counting: asyncio.Future[Admission], token: str, call_id: str,
                   max_calls: int) -> asyncio.Future[None]:
        """A call counted while its token was checked, and then not forwarded (the token ended, or the
        client went): taken back off the count once the count is in, so its runner waits for no record of it.
        In a task of its own: the answer does not wait for it, and a cancelled handler cannot stop it."""

        async def take_back() -> None:
            if await _settled(counting):
                assert self._unadmit is not None
                try:
                    await self._unadmit(token, call_id, max_calls)
                except Exception as exc:
                    log.warning("a counted call that was not forwarded could not be taken back: %r", exc)

        task = asyncio.ensure_future(take_back())
        self._taking_back.add(task)
        task.add_done_callback(self._taking_back.discard)
        return task

    async def _admission(self, request: web.Request, call: _Call) -> web.Response | None:
        """None when the call may go ahead, else the answer: 401 once the attempt's harness has exited, 403
        once its step budget is spent (neither is recorded: the policy's call never reached the model). While
        the count cannot be kept (Redis down) the call goes ahead uncounted: a harness never notices the
        outage, and its runner, finding more calls stored than counted, waits for quiet instead. A client gone
        while the count was taken leaves a counted call: it is recorded as failed, as its runner waits for
        every counted call's record."""
        if self._admit is None:
            return None
        return await self._counted(call, self._start_count(request.match_info["token"], call.call_id,
                                                           call.target.max_calls))

    async def _counted(self, call: _Call, counting: asyncio.Future[Admission]) -> web.Response | None:
        """`_admission` once its count is under way."""
        try:
            admitted = await asyncio.shield(counting)
        except asyncio.CancelledError:
            if await _settled(counting):
                call.fail("client_disconnected", "the client went away before the call was forwarded")
                self._record(call)
            raise
        except Exception as exc:
            log.warning("rollout %s: a call goes ahead uncounted, the count cannot be kept: %r",
                        call.target.rollout_id, exc)
            return None
        if admitted is Admission.BUDGET_SPENT:
            return _budget_spent(call)
        return None if admitted is Admission.ADMITTED else _unknown_token()

    async def _handle_call(self, request: web.Request, target: Target, call: _Call) -> web.StreamResponse:
        module = PROTOCOLS[call.protocol]
        raw = call.raw_request = await request.read()
        try:
            body = jsonfast.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            response = call.fail_locally(400, "invalid_request", "the request body must be a JSON object")
            return await _send(request, response, call)
        if module is gemini:  # the model and the method are in the path
            split = gemini.split_call(request.match_info["call"])
            if split is None:
                message = f"unknown Gemini method {request.match_info['call']!r} (generateContent, streamGenerateContent)"
                return await _send(request, call.fail_locally(404, "invalid_request", message), call)
            body = {**body, "model": split[0], "stream": split[1] == "streamGenerateContent"}
        call.request = body
        upstream = PROTOCOLS.get(target.protocol)
        refusal = target.refusal or (None if upstream else f"endpoint {target.endpoint!r} speaks an unknown protocol "
                                     f"{target.protocol!r}")
        if refusal or upstream is None:
            return await _send(request, call.fail_locally(403, "endpoint_refused", refusal or ""), call)
        # A body that already names the job's model goes on as the harness wrote it, byte for byte.
        forced = bool(target.model_override) and body.get("model") != target.model_override
        if forced:
            module.set_model(body, target.model_override)
        stream = module.is_stream(body, request.path)
        if upstream is module:
            sent, call.capture = capture_request(body, target.token_capture) if module.NAME == "chat" else (body, None)
            data = raw if sent is body and (not forced or module is gemini) else jsonfast.dumps(sent)
            path = module.upstream_path(body, stream) + _passed_query(request, module)
            return await self._forward(request, target, call, path, data, None)
        try:
            upstream_body = upstream.from_chat_request(module.to_chat_request(body))
        except Untranslatable as exc:
            message = f"cannot translate this {module.NAME} call for endpoint {target.endpoint!r} ({upstream.NAME}): {exc}"
            return await _send(request, call.fail_locally(400, "untranslatable", message), call)
        call.upstream_protocol = upstream.NAME
        if upstream.NAME == "chat":  # the answer is translated back, so nothing of the capture reaches the client
            upstream_body, call.capture = capture_request(upstream_body, target.token_capture)
        path = upstream.upstream_path(upstream_body, stream)
        data = jsonfast.dumps(getattr(upstream, "upstream_body", lambda b: b)(upstream_body))
        call.upstream_request = data
        return await self._forward(request, target, call, path, data, upstream)

    async def _forward(
        self, request: web.Request, target: Target, call: _Call, path: str, data: bytes, translate_from: Any
    ) -> web.StreamResponse:
        """Send the call upstream; `translate_from` is the upstream's protocol module when it differs from
        the client's (the answer is translated back), None for a pass-through."""
        headers = _protocol_headers(target, request, translate_from or PROTOCOLS[call.protocol])
        try:
            async with self._session(target).post(
                _upstream_url(target, path), data=data, headers=headers, allow_redirects=False,
            ) as upstream:
                call.status = upstream.status
                call.upstream_headers = upstream.headers.copy()
                is_stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
                if translate_from is None:
                    if is_stream:
                        return await _relay_stream(request, upstream, call)
                    call.body = call.redactor.whole(await upstream.read())
                    response = web.Response(
                        body=call.for_harness(call.body), status=upstream.status,
                        headers=_passed_on(upstream.headers, call.redactor),
                    )
                elif is_stream and upstream.status < 400:
                    return await _relay_translated_stream(request, upstream, call, translate_from)
                else:
                    response = _translated_answer(call, translate_from, call.redactor.whole(await upstream.read()),
                                                  upstream)
        except TimeoutError as exc:
            response = call.fail_locally(504, "upstream_timeout", self._timeout_message(exc))
        except aiohttp.ClientError as exc:
            refused = address_refusal_in(exc)
            if refused is not None:
                response = call.fail_locally(403, "endpoint_refused", _address_refusal(target, refused))
            else:
                response = call.fail_locally(502, "upstream_connect", f"the upstream is unreachable: {exc}")
        return await _send(request, response, call)

    def _timeout_message(self, exc: TimeoutError) -> str:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return f"could not connect to the upstream within {self._timeout.sock_connect}s"
        return f"the upstream sent nothing for {self._timeout.sock_read}s"

    def _record(self, call: _Call) -> None:
        """Hand the record to the sink (the answer is already with the client)."""
        try:
            self._sink.put(call.to_record())
        except Exception:  # a recording bug must not undo the answer
            log.exception("could not record call %s", call.call_id)


def _is_gemini_count(request: web.Request, protocol: str) -> bool:
    return protocol == "gemini" and request.match_info["call"].endswith(":countTokens")


async def _settled(counting: asyncio.Future[Admission]) -> bool:
    """Whether a call whose handler was cancelled mid-admission was counted."""
    try:
        return await counting is Admission.ADMITTED
    except Exception:
        return False


def _budget_spent(call: _Call) -> web.Response:
    """The refusal of a call past the job's step budget, in the harness's own protocol. 403, not 429: SDKs
    and CLI agents retry a 429 (some for minutes), while no retry can help here; `x-should-retry: false`
    says so to the OpenAI and Anthropic SDKs."""
    message = (f"the job's step budget of {call.target.max_calls} model calls is spent: the proxy forwards no "
               f"more calls for this rollout")
    return web.json_response(PROTOCOLS[call.protocol].error_body(STEP_BUDGET_CODE, message), status=403,
                             headers={"x-should-retry": "false"})


async def _relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse, call: _Call
) -> web.StreamResponse:
    """Write the upstream's stream to the client as it arrives, keeping each chunk for the record."""
    call.stream = True
    # Bytes that came with the upstream's headers go out with ours, in one write (on a busy machine every
    # write is a wake-up of the harness, and a wait for a core); else ours go at once, as the upstream's did.
    headers_held = upstream.content.total_bytes > 0
    response = (_HeadersWithFirstBytes if headers_held else web.StreamResponse)(
        status=upstream.status, headers=_passed_on(upstream.headers, call.redactor))
    try:
        await response.prepare(request)
    except ConnectionError:
        call.fail("client_disconnected", "the client went away before the stream started")
        return response
    # The record keeps the upstream's bytes; the harness gets them without the capture's fields.
    stripper = StreamStripper(call.capture.hidden) if call.capture is not None and call.capture.strips else None
    while True:
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            call.fail("stream_broken", f"the upstream stream broke: {exc!r}")
            if headers_held:  # the headers, then the break, as the upstream's came
                await _send_held_headers(response)
            await _relay_chunk(response, call, *_stripped_tail(call, stripper))
            _drop_connection(request)
            return response
        if not chunk:
            break
        kept = call.redactor.chunk(chunk)
        if upstream.content.is_eof() and upstream.content.exception() is None:
            # The upstream's end came with its last bytes: they go on with ours in one write, not two.
            return await _end_stream(request, response, call, *_stripped_tail(call, stripper, kept))
        sent = stripper.feed(kept) if stripper else kept
        if headers_held and not sent:  # what came with them is held back (a key's or an event's start): not they
            await _send_held_headers(response)
        if not await _relay_chunk(response, call, kept, sent):
            return response
        headers_held = False
    return await _end_stream(request, response, call, *_stripped_tail(call, stripper))


class _HeadersWithFirstBytes(web.StreamResponse):
    """A stream response whose headers wait for its first write and go with it (as aiohttp's whole `Response`
    does); used only when the first bytes are already in hand."""

    _send_headers_immediately = False


async def _send_held_headers(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionError):  # a client gone is noted by the next write
        await response.write(b"")  # a held header block with no bytes: sent alone


def _stripped_tail(call: _Call, stripper: StreamStripper | None, last: bytes = b"") -> tuple[bytes, bytes | None]:
    """The stream's last bytes (`last`, then the redactor's held tail), and what of them (with the stripper's
    held event) the harness gets."""
    tail = last + call.redactor.end()
    return tail, (stripper.feed(tail) + stripper.end()) if stripper else None


async def _end_stream(
    request: web.Request, response: web.StreamResponse, call: _Call, chunk: bytes, sent: bytes | None = None
) -> web.StreamResponse:
    """Keep the stream's last chunk for the record and send it (or `sent`) with the end of the chunked body,
    one write; then the record is made, the client having its whole answer."""
    if chunk:
        call.arrivals.append(perf_counter())
        call.chunks.append(chunk)
    try:
        await response.write_eof(chunk if sent is None else sent)
    except ConnectionError:
        call.fail("client_disconnected", "the client went away before the answer was delivered")
    return response


async def _gemini_count_tokens(request: web.Request) -> web.Response:
    """gemini-cli's token count: an estimate (characters / 4), labelled; not a model call, so not recorded."""
    raw = await request.read()
    return web.json_response({"totalTokens": max(1, len(raw) // 4), "trove_estimate": True})


def _translated_answer(call: _Call, upstream_module: Any, raw: bytes, upstream: aiohttp.ClientResponse) -> web.Response:
    """A whole upstream answer in another protocol, translated back into the client's."""
    client = PROTOCOLS[call.protocol]
    call.upstream_response = raw
    try:
        native = jsonfast.loads(raw) if raw else None
    except ValueError:
        native = None
    if upstream.status >= 400 or not isinstance(native, dict):
        message = upstream_module.error_message(native) or raw[:200].decode("utf-8", errors="replace")
        kind = "upstream_status" if upstream.status >= 400 else "malformed_body"
        status = upstream.status if upstream.status >= 400 else 502
        return call.fail_locally(status, kind, f"upstream {upstream.status}: {message}")
    call.hide_captured(native)
    try:
        answer = client.from_chat_response(upstream_module.to_chat_response(native), call.request)
    except Untranslatable as exc:
        return call.fail_locally(502, "untranslatable", f"cannot translate the {upstream_module.NAME} answer: {exc}")
    call.body = jsonfast.dumps(answer)
    return web.Response(body=call.body, status=upstream.status, content_type="application/json")


async def _relay_translated_stream(
    request: web.Request, upstream: aiohttp.ClientResponse, call: _Call, upstream_module: Any
) -> web.StreamResponse:
    """An upstream stream in another protocol, written to the client in its own as it arrives. A Chat
    Completions stream is translated chunk by chunk; a stream of another protocol is read whole first
    (then assembled, taken to chat and written out), so its time to first token is that of the whole."""
    call.stream = True
    writer = PROTOCOLS[call.protocol].Writer(call.request)
    response = web.StreamResponse(status=upstream.status,
                                  headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
    except ConnectionError:
        call.fail("client_disconnected", "the client went away before the stream started")
        return response
    parser = SseParser() if upstream_module.NAME == "chat" else None
    while True:
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            call.fail("stream_broken", f"the upstream stream broke: {exc!r}")
            _drop_connection(request)
            return response
        if not chunk:
            break
        chunk = call.redactor.chunk(chunk)
        call.upstream_chunks.append(chunk)
        if parser is not None and not await _relay_chunk(response, call, _translate_events(call, writer, parser.feed(chunk))):
            return response
    tail = call.redactor.end()
    call.upstream_chunks.append(tail)
    if parser is not None:
        translated = _translate_events(call, writer, parser.feed(tail) + parser.end())
    else:
        assembled = upstream_module.assemble(call.upstream_chunks)
        if assembled.error:
            call.fail("malformed_stream", assembled.error)
        chunks = chunks_of_response(upstream_module.to_chat_response(assembled.body or {}))
        translated = _translate_chunks(call, writer, chunks)
    try:
        translated += writer.finish()
    except Untranslatable as exc:
        call.fail("untranslatable", f"cannot translate the {upstream_module.NAME} stream: {exc}")
    return await _end_stream(request, response, call, translated)


def _translate_events(call: _Call, writer: Any, events: list[tuple[str | None, str]]) -> bytes:
    chunks = []
    for _, data in events:
        if data.strip() == "[DONE]":
            continue
        parsed = parse_json_event(data)
        if parsed is None:
            call.fail("malformed_stream", f"malformed data line: {data[:200]!r}")
        elif "error" in parsed:
            call.fail("malformed_stream", f"error event in stream: {parsed['error']}")
        else:
            call.hide_captured(parsed)
            chunks.append(parsed)
    return _translate_chunks(call, writer, chunks)


def _translate_chunks(call: _Call, writer: Any, chunks: list[dict[str, Any]]) -> bytes:
    out = b""
    for chunk in chunks:
        try:
            out += writer.feed(chunk)
        except Untranslatable as exc:
            call.fail("untranslatable", f"cannot translate the stream: {exc}")
    return out


async def _relay_chunk(response: web.StreamResponse, call: _Call, chunk: bytes, sent: bytes | None = None) -> bool:
    """Keep one (redacted) chunk for the record and pass it on (or `sent`, what the harness gets of it
    when the capture strips fields); False when the client has gone."""
    if not chunk:
        return True
    call.arrivals.append(perf_counter())
    call.chunks.append(chunk)
    sent = chunk if sent is None else sent
    if not sent:
        return True
    try:
        await response.write(sent)
    except ConnectionError:
        call.fail("client_disconnected", "the client went away during the stream")
        return False
    return True


def _drop_connection(request: web.Request) -> None:
    # The upstream broke its stream; break ours the same way (no clean end of the chunked body), so
    # the client sees the failure it would have seen talking to the upstream directly.
    if request.transport is not None:
        request.transport.close()


async def _send(request: web.Request, response: web.StreamResponse, call: _Call) -> web.StreamResponse:
    """Finish sending the response now, so the record is made after the client has its answer."""
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
    protocol: str = "chat"  # the client's
    upstream_protocol: str | None = None  # set when the call was translated for an endpoint of another
    raw_request: bytes = b""
    upstream_request: bytes = b""
    upstream_response: bytes = b""
    upstream_chunks: list[bytes] = field(default_factory=list)
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
    capture: Capture | None = None
    upstream_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    redactor: _Redactor = field(init=False)

    def __post_init__(self) -> None:
        self.redactor = _Redactor(self.target.upstream_api_key)

    def fail(self, kind: str, message: str) -> None:
        if self.error is None:  # the first failure is the cause; later ones follow from it
            self.error_kind, self.error = kind, message

    def for_harness(self, body: bytes) -> bytes:
        """A whole answer as the harness gets it: without the capture's fields it did not ask for."""
        return strip_answer(body, self.capture.hidden) if self.capture is not None and self.capture.strips else body

    def hide_captured(self, answer: dict[str, Any]) -> None:
        """Before a chat answer (or chunk) is translated for the harness: the capture's fields out of it."""
        if self.capture is not None and self.capture.strips:
            strip_fields(answer, self.capture.hidden)

    def fail_locally(self, status: int, kind: str, message: str) -> web.Response:
        """The proxy answers for the upstream: an error body in the client's protocol, recorded as the response."""
        self.status = status
        self.fail(kind, message)
        self.local_error_body = PROTOCOLS[self.protocol].error_body(kind, message)
        return web.json_response(self.local_error_body, status=status)

    def to_record(self) -> CallRecord:
        ended_at = datetime.now(UTC)
        latency_ms = (perf_counter() - self.started) * 1000.0
        native, ttft_ms = self._response()
        module = PROTOCOLS[self.protocol]
        response = native
        if native is not None and module.NAME != "chat" and self.local_error_body is None and self.status < 400:
            response = module.to_chat_response(native)
        if self.capture is not None and self.upstream_protocol == "chat" and response is not None:
            response = _with_token_fields(response, self._upstream_chat_answer())
        usage = response.get("usage") if response else None
        return CallRecord(
            call_id=self.call_id,
            rollout_id=self.target.rollout_id,
            trajectory_id=self.target.trajectory_id,
            started_at=self.started_at,
            ended_at=ended_at,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            request=self._normalised_request(),
            response=response,
            status_code=self.status,
            usage=usage if isinstance(usage, dict) else None,
            error=self.error,
            error_kind=self.error_kind,
            stream=self.stream,
            protocol=self.protocol,
            upstream_protocol=self.upstream_protocol or self.target.protocol,
            raw=self._raw_exchange(),
            token_capture=self.capture.mode if self.capture is not None else None,
            policy_version=self._policy_version(response),
        )

    def _policy_version(self, response: dict[str, Any] | None) -> str | None:
        source = self.target.policy_version_from
        if not source or self.status >= 400 or self.local_error_body is not None:
            return None
        answer = self._upstream_chat_answer() if self.upstream_protocol == "chat" else response
        version = policy_version(source, headers=self.upstream_headers, answer=answer)
        return None if version is None else self.redactor.text(version)

    def _upstream_chat_answer(self) -> dict[str, Any] | None:
        """A translated call's upstream answer when that was Chat Completions (whole, or its stream
        assembled): where the token ids are."""
        if self.upstream_chunks:
            return PROTOCOLS["chat"].assemble(self.upstream_chunks).body
        try:
            answer = jsonfast.loads(self.upstream_response) if self.upstream_response else None
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def _normalised_request(self) -> dict[str, Any]:
        """The request as Chat Completions. A request of another protocol that has no chat form (a tool
        type only its own service knows, passed through as is) is recorded by its text and the reason."""
        if self.protocol == "chat" or not self.request:
            return self.request
        try:
            return PROTOCOLS[self.protocol].to_chat_request(self.request)
        except Untranslatable as exc:
            return {"model": self.request.get("model"), "messages": [], "untranslated": str(exc)}

    def _raw_exchange(self) -> dict[str, Any] | None:
        """The bytes as they went, to replay the call exactly: kept for every call of another protocol than
        chat and every translated call; of a chat stream passed through, its bytes (a whole chat
        pass-through is its own record)."""
        chat_pass_through = self.protocol == "chat" and self.upstream_protocol is None
        if chat_pass_through and not self.stream:
            return None
        exchange: dict[str, Any] = {
            "protocol": self.protocol,
            "response": _text(b"".join(self.chunks) if self.stream else self.body),
        }
        if not chat_pass_through:  # a chat request is recorded as it came (with the model override applied)
            exchange["request"] = _text(self.raw_request)
        if self.upstream_protocol is not None:
            exchange["upstream"] = {
                "protocol": self.upstream_protocol,
                "request": _text(self.upstream_request),
                "response": _text(b"".join(self.upstream_chunks) if self.upstream_chunks else self.upstream_response),
            }
        return exchange

    def _response(self) -> tuple[dict[str, Any] | None, float | None]:
        if self.local_error_body is not None:
            return self.local_error_body, None
        if self.stream:
            assembled = PROTOCOLS[self.protocol].assemble(self.chunks)
            if assembled.error:
                self.fail("malformed_stream", assembled.error)
            first = assembled.first_content_chunk
            ttft_ms = None if first is None else (self.arrivals[first] - self.started) * 1000.0
            return assembled.body, ttft_ms
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


def _with_token_fields(response: dict[str, Any], upstream: dict[str, Any] | None) -> dict[str, Any]:
    """The recorded (translated) response with the upstream chat answer's token ids and logprobs."""
    choices = (upstream or {}).get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    kept = {key: first[key] for key in ("token_ids", "prompt_token_ids", "logprobs") if first.get(key) is not None}
    top = {"prompt_token_ids": upstream["prompt_token_ids"]} if upstream and upstream.get("prompt_token_ids") else {}
    own = response.get("choices") or [{}]
    return {**response, **top, "choices": [{**(own[0] if isinstance(own[0], dict) else {}), **kept}, *own[1:]]}


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


def _protocol_headers(target: Target, request: web.Request, module: Any) -> dict[str, str]:
    """The upstream's headers in its protocol: its way of sending the key, and for Messages the client's
    `anthropic-beta` (features it turns on) and `anthropic-version`. Nothing else of the client's goes on."""
    headers = {"Content-Type": "application/json", **module.auth_headers(target.upstream_api_key)}
    if module is messages:
        for name in ("anthropic-beta", "anthropic-version"):
            if request.headers.get(name):
                headers[name] = request.headers[name]
    return headers


def _passed_query(request: web.Request, module: Any) -> str:
    # Only `beta=true` (Claude Code's Messages calls); a client's query could carry its own key (`?key=`).
    return "?beta=true" if module is messages and request.query.get("beta") == "true" else ""


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _passed_on(headers: CIMultiDictProxy[str], redactor: _Redactor) -> CIMultiDict[str]:
    return CIMultiDict((key, redactor.text(value)) for key, value in headers.items() if _is_passed_on(key.lower()))


def _is_passed_on(name: str) -> bool:
    return name in _PASSED_ON or name.startswith(_PASSED_ON_PREFIXES)


class _Redactor:
    """Cuts the endpoint's key out of what the upstream sends back (an error that quotes it, a server that
    echoes headers), in a whole body or across a stream's chunks. Of a chunk, only a tail that could be the
    start of the key is held back (until the next chunk shows whether it is), so nothing else is delayed."""

    def __init__(self, key: str) -> None:
        self._key = key.encode() if len(key) >= MIN_REDACTED_KEY else b""
        self._held = b""

    def whole(self, data: bytes) -> bytes:
        return data.replace(self._key, REDACTED) if self._key else data

    def text(self, value: str) -> str:
        return self.whole(value.encode()).decode() if self._key and self._key in value.encode() else value

    def chunk(self, data: bytes) -> bytes:
        if not self._key:
            return data
        data = (self._held + data).replace(self._key, REDACTED)
        keep = _key_prefix_at_end(data, self._key)
        self._held = data[len(data) - keep:] if keep else b""
        return data[: len(data) - keep]

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _key_prefix_at_end(data: bytes, key: bytes) -> int:
    """The length of the longest tail of `data` that is a proper prefix of `key` (0 if none)."""
    start = data.find(key[:1], max(0, len(data) - len(key) + 1))
    while start != -1:
        if key.startswith(data[start:]):
            return len(data) - start
        start = data.find(key[:1], start + 1)
    return 0


def _address_refusal(target: Target, refused: str) -> str:
    return f"endpoint {target.endpoint or target.upstream_base_url!r} cannot be reached: {refused}"


def _error_body(code: str, message: str, *, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _error_response(status: int, code: str, message: str, *, error_type: str = "proxy_error") -> web.Response:
    return web.json_response(_error_body(code, message, error_type=error_type), status=status)




def _token_check_unavailable() -> web.Response:
    return _error_response(503, "token_check_unavailable", "the proxy cannot check the rollout token right now")


def _unknown_token() -> web.Response:
    return _error_response(
        401, "invalid_token", "unknown or expired rollout token", error_type="authentication_error"
    )
