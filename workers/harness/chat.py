"""A dependency-free OpenAI-compatible chat client for the built-in harness.

`openai_chat(...)` returns the `chat(messages) -> ChatReply` callable that `run_builtin_harness` takes. It
speaks plain HTTP/1.1 through `urllib.request` (one connection per call; keep-alive is not worth a
dependency here, since every call is one model turn lasting far longer than a TCP handshake).
Failures raise `ModelCallError`, whose `permanent` flag tells the caller whether a retry can help.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ChatFn = Callable[[list[dict[str, Any]]], "ChatReply"]

# 408 timeout, 409 conflict, 425 too early, 429 rate limited: worth retrying; other 4xx are not.
_TRANSIENT_4XX = {408, 409, 425, 429}
_MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True)
class ChatReply:
    content: str
    finish_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    model: str = ""
    id: str = ""


class ModelCallError(Exception):
    """A model call failed. `status` is the HTTP status (None for network errors and timeouts)."""

    def __init__(self, message: str, *, status: int | None = None, permanent: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.permanent = permanent


def openai_chat(
    base_url: str,
    model: str,
    api_key: str = "",
    *,
    seed: int | None = None,
    timeout: float = 120.0,
    temperature: float | None = None,
    max_tokens: int | None = None,
    extra_headers: Mapping[str, str] | None = None,
    retries: int = 2,
    retry_backoff_s: float = 1.0,
) -> ChatFn:
    """A `chat` callable that POSTs to `{base_url}/chat/completions` (base_url ends in `/v1`, as for
    OpenAI clients). `seed` goes into every request, so one harness run is one reproducible sample.
    Transient failures (network, timeout, 5xx, 429) are retried `retries` times with exponential backoff."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json", "Accept": "application/json", **(extra_headers or {})}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    options: dict[str, Any] = {"model": model, "stream": False}
    for name, value in (("seed", seed), ("temperature", temperature), ("max_tokens", max_tokens)):
        if value is not None:
            options[name] = value

    def chat(messages: list[dict[str, Any]]) -> ChatReply:
        body = json.dumps({**options, "messages": messages}).encode()
        return _call_with_retries(
            url, body, headers, timeout=timeout, retries=retries, backoff=retry_backoff_s
        )

    return chat


def _call_with_retries(
    url: str, body: bytes, headers: dict[str, str], *, timeout: float, retries: int, backoff: float
) -> ChatReply:
    attempt = 0
    while True:
        try:
            return _parse_reply(_post(url, body, headers, timeout=timeout))
        except _RetryableError as exc:
            if attempt >= retries:
                raise exc.error from exc
            time.sleep(exc.retry_after if exc.retry_after is not None else backoff * 2**attempt)
            attempt += 1


class _RetryableError(Exception):
    def __init__(self, error: ModelCallError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def _post(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise _http_error(exc) from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _RetryableError(ModelCallError(f"model endpoint unreachable: {reason}")) from exc
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ModelCallError(f"model endpoint returned invalid JSON: {raw[:200]!r}", permanent=True) from exc


def _http_error(exc: urllib.error.HTTPError) -> Exception:
    status = exc.code
    detail = _error_detail(exc.read())
    error = ModelCallError(f"model endpoint answered HTTP {status}: {detail}", status=status)
    if status >= 500 or status in _TRANSIENT_4XX:
        return _RetryableError(error, _retry_after(exc.headers.get("Retry-After")))
    error.permanent = True
    return error


def _error_detail(raw: bytes) -> str:
    try:
        payload = json.loads(raw)
        return str(payload["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:300].decode("utf-8", "replace")


def _retry_after(value: str | None) -> float | None:
    try:
        return min(float(value), _MAX_RETRY_AFTER_S) if value else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _parse_reply(payload: dict[str, Any]) -> ChatReply:
    try:
        choice = payload["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelCallError(f"model reply has no choices: {str(payload)[:200]}", permanent=True) from exc
    usage = payload.get("usage") or {}
    return ChatReply(
        content=message.get("content") or "",
        finish_reason=choice.get("finish_reason") or "",
        usage={k: int(v) for k, v in usage.items() if isinstance(v, int)},
        model=payload.get("model", ""),
        id=payload.get("id", ""),
    )
