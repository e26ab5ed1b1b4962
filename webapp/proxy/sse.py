"""Turn the bytes of an OpenAI chat-completions stream back into the equivalent non-stream body.

The proxy passes stream bytes through untouched and keeps them (with each chunk's arrival time); this
module runs after the stream has ended, off the byte-relay path. It follows the SSE framing (events end at
a blank line; several `data:` lines in one event are joined with newlines) and merges deltas the way the
OpenAI SDK accumulates them: text fields concatenate, tool-call fragments merge by their `index`,
logprob and token-id lists concatenate, the last `finish_reason` and the last `usage` win.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webapp.proxy import jsonfast

# Delta keys that are not text to concatenate.
_STRUCTURED_DELTA_KEYS = frozenset({"role", "tool_calls", "function_call"})
# Top-level chunk keys copied once into the assembled body.
_HEADER_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier", "prompt_token_ids")


@dataclass
class AssembledStream:
    body: dict[str, Any] | None  # the equivalent non-stream body, None when no chunk parsed
    ttft_ms: float | None  # first chunk that carried content, reasoning or a tool call
    error: str | None = None  # a malformed data line or an error event from the upstream
    done: bool = False  # the stream ended with `data: [DONE]`


@dataclass
class _Choice:
    index: int
    message: dict[str, Any] = field(default_factory=dict)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, list[Any]] | None = None
    token_ids: list[Any] | None = None

    def as_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None, **self.message}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice: dict[str, Any] = {"index": self.index, "message": message, "finish_reason": None}
        choice.update(self.extra)
        choice["logprobs"] = self.logprobs
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        return choice


class _Assembler:
    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.done = False
        self.parsed_any = False

    def feed_event(self, data: str) -> bool:
        """Merge one event's data; True when it carried content, reasoning or a tool call."""
        if data.strip() == "[DONE]":
            self.done = True
            return False
        try:
            chunk = jsonfast.loads(data)
        except ValueError:
            self._note_error(f"malformed data line: {data[:200]!r}")
            return False
        if not isinstance(chunk, dict):
            self._note_error(f"data line is not a JSON object: {data[:200]!r}")
            return False
        self.parsed_any = True
        return self._merge_chunk(chunk)

    def _note_error(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def _merge_chunk(self, chunk: dict[str, Any]) -> bool:
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            self._note_error(f"error event in stream: {message}")
        for key in _HEADER_KEYS:
            if chunk.get(key) is not None:
                self.header.setdefault(key, chunk[key])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        carried = False
        for raw in chunk.get("choices") or []:
            if isinstance(raw, dict):
                carried = self._merge_choice(raw) or carried
        return carried

    def _merge_choice(self, raw: dict[str, Any]) -> bool:
        index = raw.get("index", 0)
        choice = self.choices.setdefault(index, _Choice(index=index))
        for key, value in raw.items():
            if key in ("index", "delta"):
                continue
            if key == "logprobs":
                choice.logprobs = _merge_logprobs(choice.logprobs, value)
            elif key == "token_ids" and isinstance(value, list):
                choice.token_ids = (choice.token_ids or []) + value
            elif value is not None:
                choice.extra[key] = value
        delta = raw.get("delta")
        return _merge_delta(choice, delta) if isinstance(delta, dict) else False

    def body(self) -> dict[str, Any] | None:
        if not self.parsed_any:
            return None
        body: dict[str, Any] = {"object": "chat.completion", **self.header}
        body["choices"] = [self.choices[i].as_openai() for i in sorted(self.choices)]
        body["usage"] = self.usage
        return body


def _merge_delta(choice: _Choice, delta: dict[str, Any]) -> bool:
    carried = False
    for key, value in delta.items():
        if key == "role":
            if value:
                choice.message.setdefault("role", value)
        elif key == "tool_calls":
            carried = _merge_tool_calls(choice, value) or carried
        elif key == "function_call" and isinstance(value, dict):
            _merge_function(choice.message.setdefault("function_call", {}), value)
            carried = True
        elif isinstance(value, str):
            choice.message[key] = (choice.message.get(key) or "") + value
            carried = carried or bool(value)
        elif value is not None and key not in _STRUCTURED_DELTA_KEYS:
            choice.message[key] = value
    return carried


def _merge_tool_calls(choice: _Choice, deltas: Any) -> bool:
    if not isinstance(deltas, list):
        return False
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        call = choice.tool_calls.setdefault(delta.get("index", len(choice.tool_calls)), {})
        for key in ("id", "type"):
            if delta.get(key) and not call.get(key):
                call[key] = delta[key]
        if isinstance(delta.get("function"), dict):
            _merge_function(call.setdefault("function", {}), delta["function"])
    return bool(deltas)


def _merge_function(function: dict[str, Any], delta: dict[str, Any]) -> None:
    # The name comes whole in one fragment (servers that repeat it would otherwise read "fnfn");
    # the arguments come as fragments of a JSON string.
    if delta.get("name") and not function.get("name"):
        function["name"] = delta["name"]
    if isinstance(delta.get("arguments"), str):
        function["arguments"] = function.get("arguments", "") + delta["arguments"]
    function.setdefault("arguments", "")


def _merge_logprobs(current: dict[str, list[Any]] | None, value: Any) -> dict[str, list[Any]] | None:
    if not isinstance(value, dict):
        return current
    merged = current if current is not None else {}
    for key, items in value.items():
        if isinstance(items, list):
            merged[key] = merged.get(key, []) + items
    return merged


def assemble_stream(chunks: list[bytes], arrivals: list[float], started: float) -> AssembledStream:
    """Assemble a chat-completions SSE stream.

    `arrivals[i]` is the `time.perf_counter()` at which `chunks[i]` arrived and `started` the one at which
    the request was sent; the time to first token is measured to the chunk that completed the first
    content-bearing event.
    """
    assembler = _Assembler()
    ttft_ms: float | None = None
    pending = b""
    data_lines: list[str] = []
    for chunk, arrived in zip(chunks, arrivals, strict=True):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if _feed_line(assembler, data_lines, line) and ttft_ms is None:
                ttft_ms = (arrived - started) * 1000.0
    if pending:
        _feed_line(assembler, data_lines, pending)
    if data_lines:  # an event the stream ended without terminating
        assembler.feed_event("\n".join(data_lines))
    return AssembledStream(assembler.body(), ttft_ms, assembler.error, assembler.done)


def _feed_line(assembler: _Assembler, data_lines: list[str], raw: bytes) -> bool:
    line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
    if not line:
        if not data_lines:
            return False
        event = "\n".join(data_lines)
        data_lines.clear()
        return assembler.feed_event(event)
    if line.startswith("data:"):
        value = line[5:]
        data_lines.append(value[1:] if value.startswith(" ") else value)
    return False  # comments (":"), `event:`, `id:` and `retry:` lines carry no chunk
