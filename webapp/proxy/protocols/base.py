"""What every protocol module provides, and the SSE framing they share.

A protocol module knows its own shapes and how they map to OpenAI Chat Completions, the proxy's hub and
normalised form: a call in any protocol is recorded as the Chat Completions request and response it
amounts to, and a call between two different protocols is translated through it (A -> chat -> B and
back). What has no place in the other protocol is refused with `Untranslatable`, naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from typing import Protocol as TypingProtocol

from webapp.proxy import jsonfast


class Untranslatable(ValueError):
    """A request or response field with no equivalent in the other protocol. `field` is its path."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path


class StreamWriter(TypingProtocol):
    """Turns Chat Completions stream chunks (dicts) into this protocol's SSE bytes, as they come."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass
class Assembled:
    """A stream put back together: the equivalent non-stream body, when the first content-bearing event
    arrived (an index into the chunks), and what was wrong with it."""

    body: dict[str, Any] | None
    first_content_chunk: int | None
    error: str | None = None


@dataclass
class SseEvent:
    event: str | None
    data: str
    chunk_index: int  # the chunk that completed it


# --- what most protocols share: a `stream` flag and a `model` field in the body, a Bearer key ----------------
# A protocol module names these as its own (`is_stream = body_stream_flag`); Gemini, whose stream and model
# live in the URL, and Messages, whose key goes in x-api-key, define their own.


def body_stream_flag(body: dict[str, Any], path: str) -> bool:
    return bool(body.get("stream"))


def set_body_model(body: dict[str, Any], model: str) -> None:
    body["model"] = model


def bearer_auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def sse_events(chunks: list[bytes]) -> Iterator[SseEvent]:
    """The SSE events in a stream's chunks (events end at a blank line; `data:` lines join with newlines)."""
    parser = SseParser()
    for index, chunk in enumerate(chunks):
        for event, data in parser.feed(chunk):
            yield SseEvent(event, data, index)
    for event, data in parser.end():
        yield SseEvent(event, data, len(chunks) - 1)


@dataclass
class SseParser:
    """An incremental SSE parser: feed bytes, get the (event, data) pairs they completed."""

    _pending: bytes = b""
    _event: str | None = None
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        out: list[tuple[str | None, str]] = []
        for raw in lines:
            self._line(raw, out)
        return out

    def end(self) -> list[tuple[str | None, str]]:
        out: list[tuple[str | None, str]] = []
        if self._pending:
            self._line(self._pending, out)
            self._pending = b""
        if self._data:
            out.append((self._event, "\n".join(self._data)))
            self._data, self._event = [], None
        return out

    def _line(self, raw: bytes, out: list[tuple[str | None, str]]) -> None:
        line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
        if not line:
            if self._data:
                out.append((self._event, "\n".join(self._data)))
            self._data, self._event = [], None
        elif line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        elif line.startswith("event:"):
            self._event = line[6:].strip()


def parse_json_event(data: str) -> dict[str, Any] | None:
    try:
        value = jsonfast.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def sse_bytes(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def text_of(content: Any) -> str:
    """Text of a string or a list of parts (any protocol's text parts have a `text`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return json.dumps(content)


def arguments_object(arguments: Any, where: str) -> dict[str, Any]:
    """A chat tool call's `arguments` (a JSON string) as the object other protocols carry."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError) as exc:
        raise Untranslatable(where, "tool call arguments are not JSON") from exc
    if not isinstance(value, dict):
        raise Untranslatable(where, "tool call arguments are not a JSON object")
    return value


def chat_finish(has_tool_calls: bool, truncated: bool) -> str:
    if truncated:
        return "length"
    return "tool_calls" if has_tool_calls else "stop"


def chat_response(
    *, response_id: str, model: str | None, content: str | None, reasoning: str | None,
    tool_calls: list[dict[str, Any]], finish: str, usage: dict[str, Any] | None,
    logprobs: dict[str, Any] | None = None, created: int = 0,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": response_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage}


def chat_parts(chat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(first choice, its message, usage) of a chat response, each {} when missing."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    return choice, message or {}, chat.get("usage") or {}


def chunks_of_response(chat: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole chat response as the stream chunks that add up to it (for a stream that had to be read
    whole before it could be translated)."""
    choice, message, usage = chat_parts(chat)
    base = {"id": chat.get("id"), "object": "chat.completion.chunk", "created": chat.get("created", 0),
            "model": chat.get("model")}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    if message.get("reasoning_content"):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"reasoning_content": message["reasoning_content"]}}]})
    if message.get("content"):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": message["content"]}}]})
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if usage:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


@dataclass
class ChatStreamState:
    """What a chat stream has said so far, for writers that must close what they opened."""

    response_id: str = ""
    model: str | None = None
    finish: str | None = None
    usage: dict[str, Any] | None = None
    started: bool = False
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # the content tokens' logprobs, in order

    def take(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Note the chunk's header, finish reason and usage; return its first choice's delta events."""
        self.response_id = self.response_id or str(chunk.get("id") or "")
        self.model = self.model or chunk.get("model")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        deltas = []
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                if choice.get("finish_reason"):
                    self.finish = choice["finish_reason"]
                self.logprobs += (choice.get("logprobs") or {}).get("content") or []
                if isinstance(choice.get("delta"), dict):
                    deltas.append(choice["delta"])
        return deltas
