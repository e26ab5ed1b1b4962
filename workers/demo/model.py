"""The offline demo model: a model server on aiohttp speaking the four protocols harnesses speak.

It is a STAND-IN for a real model server (vLLM, SGLang, a hosted API): replies come from the scripted
policy in `workers.demo.policy`, which only knows Trove's built-in demo tasks. Every response says so:
`system_fingerprint` and `model` are "trove-demo-stand-in", the models list describes it, and responses
carry an `X-Trove-Stand-In` header.

Endpoints: `POST /v1/chat/completions` (OpenAI Chat Completions), `POST /v1/responses` (OpenAI Responses),
`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages; `HEAD /` answers the pre-connect),
`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse` (Gemini), each JSON or a
stream of that protocol's SSE events; `GET /v1/models`, `GET /v1/models/{id}`, `GET /healthz`.
With tools offered, the policy runs its commands through the request's shell-like tool (workers.demo.
policy.next_turn) and ends with a plain answer; without, it answers in text with a ```bash block. With
`logprobs` / `return_token_ids` / `return_prompt_token_ids` (chat: vLLM's and SGLang's fields) or
`include: ["message.output_text.logprobs"]` (Responses) it returns token logprobs and ids from a small
deterministic tokenizer over a ChatML-style template (workers.demo.wire), so the ids of a growing
conversation chain as a real server's do. `make_app(generations=[...])` keeps what it generated for each
chat call (prompt ids, completion ids, logprobs): the record a test checks RL samples against.
`make_app(weight_version=...)` names the "weights" in an `X-Weight-Version` header and, on whole chat
answers, in `metadata.weight_version` (where SGLang puts it).
Randomness: the policy is seeded from the user text before the first reply plus the request's `seed` (or,
without one, its `user` field; Codex's `prompt_cache_key`, Claude Code's `metadata.user_id`), so the same
conversation and seed always get the same reply.

Run standalone: `python -m workers.demo.model --port 8700`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from workers.demo import wire
from workers.demo.policy import Tool, next_turn

MODEL_ID = "trove-demo-stand-in"
STAND_IN_NOTICE = (
    "Trove demo stand-in: a scripted offline policy that works Trove's built-in demo tasks. "
    "It is not a language model; use it to try Trove without a model server."
)
_STAND_IN_HEADERS = {"X-Trove-Stand-In": "demo"}
_MAX_BODY_BYTES = 8 * 1024 * 1024
_LATENCY = web.AppKey("latency_s", float)
_CHUNK_DELAY = web.AppKey("chunk_delay_s", float)
_GENERATIONS: web.AppKey[list[Any] | None] = web.AppKey("generations", list)
_WEIGHT_VERSION: web.AppKey[str | None] = web.AppKey("weight_version", str)
_STRATEGY: web.AppKey[str | None] = web.AppKey("strategy", str)
WEIGHT_VERSION_HEADER = "X-Weight-Version"
# The token capture the demo model answers (ModelEndpoint.token_capture, webapp/proxy/capture.py): vLLM's
# fields, so the demo's endpoint asks for token ids and its runs give exact RL samples. It answers SGLang's
# too; one is enough, and vLLM's is what most RL stacks run.
TOKEN_CAPTURE = "vllm"


_BadRequest = wire.BadRequest


def make_app(*, latency_s: float = 0.0, chunk_delay_s: float = 0.0, generations: list | None = None,
             weight_version: str | None = None, strategy: str | None = None) -> web.Application:
    """`latency_s` delays every reply and `chunk_delay_s` every stream chunk, to look like a real server
    in a demo (time to first token); both default to 0. `generations`, when given, gets one
    `wire.generation_record` per chat call served; `weight_version` is reported with every answer.
    `strategy` makes every episode take that strategy (policy.next_action), for tests that need a solve."""
    app = web.Application(client_max_size=_MAX_BODY_BYTES)
    app[_STRATEGY] = strategy
    app[_LATENCY] = latency_s
    app[_CHUNK_DELAY] = chunk_delay_s
    app[_GENERATIONS] = generations
    app[_WEIGHT_VERSION] = weight_version
    app.router.add_post("/v1/chat/completions", _handler("chat"))
    app.router.add_post("/v1/responses", _handler("responses"))
    app.router.add_post("/v1/messages", _handler("messages"))
    app.router.add_post("/v1/messages/count_tokens", _count_tokens)
    app.router.add_post("/v1beta/models/{call}", _gemini)
    app.router.add_route("HEAD", "/", _preconnect)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model_id}", _get_model)
    app.router.add_get("/healthz", _health)
    return app


def serve_in_thread(
    host: str = "127.0.0.1", port: int = 0, **app_options: Any
) -> tuple[str, Callable[[], None]]:
    """Start the server on a daemon thread. Returns (base URL ending in /v1, stop). Port 0 picks a free
    port. `stop()` shuts the server down and joins the thread; calling it twice is harmless."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(**app_options), access_log=None)
    started = threading.Event()
    address: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, host, port).start())
            address.extend(runner.addresses[0][:2])
        except BaseException as exc:  # reported to the starting thread below (e.g. port in use)
            failure.append(exc)
            started.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name=f"demo-model-{port}", daemon=True)
    thread.start()
    if not started.wait(timeout=30) or failure:
        raise RuntimeError(f"demo model server did not start on {host}:{port}: {failure[:1]}")

    def stop() -> None:
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)

    bound_host, bound_port = address
    return f"http://{_url_host(bound_host)}:{bound_port}/v1", stop


# The four protocols: how to read a request (messages and tools for the policy), the seed it carries, the
# limit on its output, whether it asks for reasoning, and how to answer it whole or streamed.
@dataclass(frozen=True)
class _Wire:
    read: Callable[[Any], tuple[list[dict[str, Any]], list[Tool]]]
    id_prefix: str
    answer: Callable[[dict[str, Any], wire.Reply, str], dict[str, Any]]
    stream: Callable[[dict[str, Any], wire.Reply, str], list[bytes]]


def _chat_validate(body: Any) -> tuple[list[dict[str, Any]], list[Tool]]:
    messages, tools = wire.chat_read(body)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _BadRequest("'seed' must be an integer", param="seed")
    if body.get("n", 1) != 1:
        raise _BadRequest("the demo stand-in returns exactly one choice; 'n' must be 1", param="n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise _BadRequest(f"'{name}' must be a positive integer", param=name)
    return messages, tools


_WIRES = {
    "chat": _Wire(_chat_validate, "chatcmpl-", wire.chat_completion, wire.chat_stream),
    "responses": _Wire(wire.responses_read, "resp_", wire.responses_body, wire.responses_stream),
    "messages": _Wire(wire.messages_read, "msg_", lambda body, reply, rid: wire.messages_body(reply, rid),
                      lambda body, reply, rid: wire.messages_stream(reply, rid)),
    "gemini": _Wire(wire.gemini_read, "gen-", lambda body, reply, rid: wire.gemini_body(reply, rid),
                    lambda body, reply, rid: wire.gemini_stream(reply, rid)),
}


def reply_for(protocol: str, body: Any, *, strategy: str | None = None) -> tuple[dict[str, Any], wire.Reply]:
    """The validated body and the policy's reply to it, in `protocol`'s terms. Raises _BadRequest."""
    messages, tools = _WIRES[protocol].read(body)
    seed = _seed(protocol, body)
    turn = next_turn(messages, tools, seed=seed if isinstance(seed, (int, str)) else json.dumps(seed),
                     strategy=strategy)
    return body, wire.make_reply(turn, messages, reasoning=_wants_reasoning(protocol, body),
                                 limit=_output_limit(protocol, body))


def completion(body: dict[str, Any], protocol: str = "chat") -> dict[str, Any]:
    """The non-streaming response to a request body."""
    body, reply = reply_for(protocol, body)
    return _WIRES[protocol].answer(body, reply, _response_id(protocol))


def stream_events(body: dict[str, Any], protocol: str = "chat") -> list[bytes]:
    """The SSE events of a streaming response; they add up to the same answer as `completion(body)`."""
    body, reply = reply_for(protocol, body)
    return _WIRES[protocol].stream(body, reply, _response_id(protocol))


def _response_id(protocol: str) -> str:
    return f"{_WIRES[protocol].id_prefix}{uuid.uuid4().hex}"


def _seed(protocol: str, body: dict[str, Any]) -> Any:
    """What seeds the policy: chat's `seed` (else its `user`); Codex's `prompt_cache_key` (one per session);
    Claude Code's `metadata.user_id`; Gemini's `generationConfig.seed`."""
    if protocol == "chat":
        return body.get("seed") if body.get("seed") is not None else body.get("user") or body.get("prompt_cache_key")
    if protocol == "responses":
        return body.get("prompt_cache_key") or body.get("user")
    if protocol == "messages":
        return (body.get("metadata") or {}).get("user_id")
    return (body.get("generationConfig") or {}).get("seed")


def _output_limit(protocol: str, body: dict[str, Any]) -> int | None:
    if protocol == "chat":
        return body.get("max_completion_tokens") or body.get("max_tokens")
    if protocol == "responses":
        return body.get("max_output_tokens")
    if protocol == "messages":
        return None  # Claude Code always sends a max_tokens far above anything the stand-in says
    return (body.get("generationConfig") or {}).get("maxOutputTokens")


def _wants_reasoning(protocol: str, body: dict[str, Any]) -> bool:
    if protocol == "chat":
        return body.get("reasoning_effort") not in (None, "none")
    if protocol == "responses":
        return isinstance(body.get("reasoning"), dict) and body["reasoning"].get("effort") != "none"
    if protocol == "messages":
        return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
    return bool(thinking.get("includeThoughts"))


def _handler(protocol: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            streamed = _is_streamed(protocol, request, body)
            body, reply = reply_for(protocol, body, strategy=request.app[_STRATEGY])
        except _BadRequest as exc:
            return _error(400, str(exc), param=exc.param, protocol=protocol)
        response_id = _response_id(protocol)
        events = _WIRES[protocol].stream(body, reply, response_id) if streamed else None
        answer = None if streamed else _WIRES[protocol].answer(body, reply, response_id)
        version = request.app[_WEIGHT_VERSION]
        headers = {**_STAND_IN_HEADERS, **({WEIGHT_VERSION_HEADER: version} if version else {})}
        generations = request.app[_GENERATIONS]
        if protocol == "chat" and generations is not None:
            generations.append(wire.generation_record(body, reply))
        if request.app[_LATENCY]:
            await asyncio.sleep(request.app[_LATENCY])
        if answer is not None:
            if version and protocol == "chat":
                answer["metadata"] = {"weight_version": version}
            return web.json_response(answer, headers=headers)
        return await _stream(request, events or [], headers)

    return handle


def _is_streamed(protocol: str, request: web.Request, body: Any) -> bool:
    if protocol == "gemini":
        return request.match_info["call"].endswith(":streamGenerateContent")
    return isinstance(body, dict) and bool(body.get("stream"))


async def _gemini(request: web.Request) -> web.StreamResponse:
    # /v1beta/models/{model}:{method}: aiohttp cannot split on ':' in a route, so the handler does.
    model, _, method = request.match_info["call"].partition(":")
    if method not in ("generateContent", "streamGenerateContent") or not model:
        return _error(404, f"unknown Gemini method {request.match_info['call']!r}", protocol="gemini")
    return await _GEMINI_HANDLER(request)


async def _count_tokens(request: web.Request) -> web.Response:
    try:
        messages, _ = wire.messages_read(await _json_body(request))
    except _BadRequest as exc:
        return _error(400, str(exc), param=exc.param, protocol="messages")
    return web.json_response({"input_tokens": wire.prompt_tokens(messages)}, headers=_STAND_IN_HEADERS)


async def _preconnect(request: web.Request) -> web.Response:
    return web.Response(status=200, headers=_STAND_IN_HEADERS)


async def _stream(request: web.Request, events: list[bytes], headers: dict[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
    await response.prepare(request)
    for event in events:
        await response.write(event)
        if request.app[_CHUNK_DELAY]:
            await asyncio.sleep(request.app[_CHUNK_DELAY])
    await response.write_eof()
    return response


_GEMINI_HANDLER = _handler("gemini")


async def _list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card()]}, headers=_STAND_IN_HEADERS)


async def _get_model(request: web.Request) -> web.Response:
    if request.match_info["model_id"] != MODEL_ID:
        return _error(
            404, f"The model '{request.match_info['model_id']}' does not exist", code="model_not_found"
        )
    return web.json_response(_model_card(), headers=_STAND_IN_HEADERS)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "model": MODEL_ID, "stand_in": True})


def _model_card() -> dict[str, Any]:
    return {
        "id": MODEL_ID,
        "object": "model",
        "created": 0,
        "owned_by": "trove",
        "description": STAND_IN_NOTICE,
        "stand_in": True,
    }


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"request body is not valid JSON: {exc}") from exc


def _error(
    status: int, message: str, *, param: str | None = None, code: str | None = None, protocol: str = "chat"
) -> web.Response:
    """An error in the shape the request's protocol uses."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if protocol == "messages":
        payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    elif protocol == "gemini":
        payload = {"error": {"code": status, "message": message, "status": "INVALID_ARGUMENT"}}
    else:
        payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(payload, status=status, headers=_STAND_IN_HEADERS)

def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=f"{STAND_IN_NOTICE} OpenAI-compatible, offline.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to wait before each reply")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream chunks")
    args = parser.parse_args(argv)
    print(f"{STAND_IN_NOTICE}\nServing model '{MODEL_ID}' at http://{args.host}:{args.port}/v1", flush=True)
    web.run_app(
        make_app(latency_s=args.latency, chunk_delay_s=args.chunk_delay),
        host=args.host,
        port=args.port,
        print=None,
    )


if __name__ == "__main__":
    main()
