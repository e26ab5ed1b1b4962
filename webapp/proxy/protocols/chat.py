"""OpenAI Chat Completions: the proxy's hub and normalised form, so its translations are identities.

Route: `POST /r/<token>/v1/chat/completions`; upstream `{base_url}/chat/completions`.
"""

from __future__ import annotations

from typing import Any

from webapp.proxy.protocols.base import (
    Assembled,
    bearer_auth_headers,
    body_stream_flag,
    set_body_model,
    sse_bytes,
)
from webapp.proxy.sse import assemble_stream

NAME = "chat"
ROUTES = (("POST", "/v1/chat/completions"),)


def upstream_path(body: dict[str, Any], stream: bool) -> str:
    return "/chat/completions"


is_stream = body_stream_flag


set_model = set_body_model


auth_headers = bearer_auth_headers


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    return body


def from_chat_request(chat: dict[str, Any]) -> dict[str, Any]:
    body = dict(chat)
    if body.get("stream"):  # usage arrives only when asked for, and the other side's stream reports it
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def to_chat_response(body: dict[str, Any]) -> dict[str, Any]:
    return body


def from_chat_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    return chat


def assemble(chunks: list[bytes]) -> Assembled:
    # The arrival times are applied by the caller: here only which chunk carried the first content.
    assembled = assemble_stream(chunks, [float(i) for i in range(len(chunks))], 0.0)
    first = None if assembled.ttft_ms is None else int(assembled.ttft_ms / 1000.0)
    return Assembled(assembled.body, first, assembled.error)


class Writer:
    """Chat chunks back out as a chat stream (the client speaks chat, the upstream another protocol)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._usage = bool((request.get("stream_options") or {}).get("include_usage"))

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if not chunk.get("choices") and not self._usage:
            return b""
        return sse_bytes(chunk)

    def finish(self) -> bytes:
        return b"data: [DONE]\n\n"


def error_body(code: str, message: str, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def error_message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return error if isinstance(error, str) else None
