"""The offline demo model: an OpenAI-compatible chat-completions server on aiohttp.

It is a STAND-IN for a real model server (vLLM, SGLang, a hosted API): replies come from the scripted
policy in `workers.demo.policy`, which only knows Trove's built-in demo tasks. Every response says so:
`system_fingerprint` and `model` are "trove-demo-stand-in", the models list describes it, and responses
carry an `X-Trove-Stand-In` header.

Endpoints: `POST /v1/chat/completions` (JSON, or SSE with `"stream": true`), `GET /v1/models`,
`GET /v1/models/{id}`, `GET /healthz`.
Randomness: the policy is seeded from the first user message plus the request's `seed` (or, without one,
its `user` field), so the same conversation and seed always get the same reply.

Run standalone: `python -m workers.demo.model --port 8700`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from workers.demo.policy import next_reply

MODEL_ID = "trove-demo-stand-in"
STAND_IN_NOTICE = (
    "Trove demo stand-in: a scripted offline policy that works Trove's built-in demo tasks. "
    "It is not a language model; use it to try Trove without a model server."
)
_STAND_IN_HEADERS = {"X-Trove-Stand-In": "demo"}
_MAX_BODY_BYTES = 8 * 1024 * 1024
_LATENCY = web.AppKey("latency_s", float)
_CHUNK_DELAY = web.AppKey("chunk_delay_s", float)


class _BadRequest(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def make_app(*, latency_s: float = 0.0, chunk_delay_s: float = 0.0) -> web.Application:
    """`latency_s` delays every reply and `chunk_delay_s` every stream chunk, to look like a real server
    in a demo (time to first token); both default to 0."""
    app = web.Application(client_max_size=_MAX_BODY_BYTES)
    app[_LATENCY] = latency_s
    app[_CHUNK_DELAY] = chunk_delay_s
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model_id}", _get_model)
    app.router.add_get("/healthz", _health)
    return app


def serve_in_thread(
    host: str = "127.0.0.1", port: int = 0, **app_options: float
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


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming response to a validated request body."""
    content, finish_reason = _reply(body)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "system_fingerprint": MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": _usage(body["messages"], content),
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a streaming response (without the final `[DONE]`). Their deltas concatenate to the
    same content as `completion(body)`."""
    content, finish_reason = _reply(body)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL_ID,
        "system_fingerprint": MODEL_ID,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice], **extra}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in _pieces(content)]
    chunks.append(chunk({}, finish_reason))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(body["messages"], content)})
    return chunks


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        body = _validate(await _json_body(request))
    except _BadRequest as exc:
        return _error(400, str(exc), param=exc.param)
    if request.app[_LATENCY]:
        await asyncio.sleep(request.app[_LATENCY])
    if not body.get("stream"):
        return web.json_response(completion(body), headers=_STAND_IN_HEADERS)
    return await _stream(request, stream_chunks(body))


async def _stream(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **_STAND_IN_HEADERS}
    )
    await response.prepare(request)
    for item in chunks:
        await response.write(f"data: {json.dumps(item)}\n\n".encode())
        if request.app[_CHUNK_DELAY]:
            await asyncio.sleep(request.app[_CHUNK_DELAY])
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


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


def _validate(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
    if body.get("n", 1) != 1:
        raise _BadRequest("the demo stand-in returns exactly one choice; 'n' must be 1", param="n")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _BadRequest("'seed' must be an integer", param="seed")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise _BadRequest(f"'{name}' must be a positive integer", param=name)
    return body


def _reply(body: dict[str, Any]) -> tuple[str, str]:
    seed = body.get("seed")
    content = next_reply(body["messages"], seed=seed if seed is not None else body.get("user"))
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is not None and _tokens(content) > limit:
        return content[: limit * 4], "length"
    return content, "stop"


def _usage(messages: list[dict[str, Any]], content: str) -> dict[str, int]:
    # Approximate tokens as characters / 4, plus a few per message for the chat template.
    prompt = 3 + sum(4 + _tokens(_content_text(m.get("content"))) for m in messages)
    completion_tokens = _tokens(content)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def _content_text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content or "")


def _tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _pieces(content: str) -> list[str]:
    """Split into word-sized pieces (whitespace kept) so a stream looks like token deltas."""
    return re.findall(r"\s*\S+|\s+", content)


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
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
