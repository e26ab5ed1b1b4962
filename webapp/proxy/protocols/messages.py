"""Anthropic Messages (what Claude Code speaks): `POST /r/<token>/v1/messages` (Claude Code adds
`?beta=true`), `POST /r/<token>/v1/messages/count_tokens`, and `HEAD /r/<token>/` (its pre-connect).
Upstream `{base_url}/messages`, with `x-api-key`, `anthropic-version` and the client's `anthropic-beta`.

Content is blocks: `text`, `tool_use` / `tool_result` (linked by id), `thinking` (with its signature) and
`redacted_thinking`. Claude Code also sends a `role: "system"` message in the middle of `messages`; it is a
system message there in the normalised form, and sent as one to a Chat Completions endpoint.
"""

from __future__ import annotations

import json
from typing import Any

from webapp.proxy.protocols.base import (
    Assembled,
    ChatStreamState,
    Untranslatable,
    arguments_object,
    body_stream_flag,
    chat_parts,
    chat_response,
    parse_json_event,
    set_body_model,
    sse_bytes,
    sse_events,
    text_of,
)

NAME = "messages"
ROUTES = (("POST", "/v1/messages"),)
ANTHROPIC_VERSION = "2023-06-01"
_STOP_TO_CHAT = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                 "pause_turn": "stop", "refusal": "content_filter"}
_CHAT_TO_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}
# Fields that steer Anthropic's service, not the model's answer: dropped on the way to a chat endpoint.
_SERVICE_FIELDS = frozenset({"context_management", "service_tier", "container", "mcp_servers", "betas"})


def upstream_path(body: dict[str, Any], stream: bool) -> str:
    return "/messages"


is_stream = body_stream_flag


set_model = set_body_model


def auth_headers(key: str) -> dict[str, str]:
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if key:
        headers["x-api-key"] = key
    return headers


# --------------------------------------------------------------------------- requests


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _system_text(body["system"], "system")})
    for i, message in enumerate(body.get("messages") or []):
        messages += _chat_messages(message, f"messages[{i}]")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name, value in body.items():
        if name in ("model", "messages", "system") or name in _SERVICE_FIELDS:
            continue
        if name == "tools":
            chat["tools"] = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(value or [])]
        elif name == "tool_choice":
            chat["tool_choice"] = _chat_tool_choice(value)
        elif name == "thinking":
            if isinstance(value, dict) and value.get("type") in ("enabled", "adaptive"):
                chat.setdefault("reasoning_effort", "medium")
        elif name == "output_config":
            if isinstance(value, dict) and value.get("effort"):
                chat["reasoning_effort"] = value["effort"]
            if isinstance(value, dict) and value.get("format"):
                raise Untranslatable("output_config.format", "structured output formats are not translated")
        elif name == "metadata":
            if isinstance(value, dict) and value.get("user_id"):
                chat["user"] = str(value["user_id"])
        elif name == "stop_sequences":
            chat["stop"] = value
        elif name in ("max_tokens", "stream", "temperature", "top_p", "top_k"):
            chat[name] = value
        else:
            raise Untranslatable(name, "no Chat Completions equivalent")
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def _system_text(system: Any, where: str) -> str:
    if isinstance(system, str):
        return system
    out = []
    for j, block in enumerate(system or []):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise Untranslatable(f"{where}[{j}]", "only text blocks are translated in a system prompt")
        out.append(str(block.get("text", "")))
    return "\n".join(out)


def _chat_messages(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        raise Untranslatable(where, "a message must be an object")
    role, content = message.get("role"), message.get("content")
    if role == "system":  # Claude Code's mid-conversation system message
        return [{"role": "system", "content": _system_text(content, f"{where}.content")}]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    if role == "assistant":
        return [_assistant_message(blocks, where)]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                        "content": _tool_result_text(block, f"{where}.content[{j}]")})
        elif kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image" and (block.get("source") or {}).get("type") == "base64":
            source = block["source"]
            parts.append({"type": "image_url",
                          "image_url": {"url": f"data:{source.get('media_type')};base64,{source.get('data')}"}})
        else:
            raise Untranslatable(f"{where}.content[{j}]", f"{kind!r} blocks have no Chat Completions equivalent")
    if parts:
        text_only = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "\n".join(p["text"] for p in parts) if text_only else parts})
    return out


def _assistant_message(blocks: list[Any], where: str) -> dict[str, Any]:
    text, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # opaque to anything but Anthropic's service; a chat model has no use for it
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
        else:
            raise Untranslatable(f"{where}.content[{j}]", f"{kind!r} blocks have no Chat Completions equivalent")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") not in ("text",) for b in content):
        raise Untranslatable(f"{where}.content", "only text tool results are translated")
    text = text_of(content) if not isinstance(content, list) else "\n".join(text_of(b.get("text")) for b in content)
    return f"[error] {text}" if block.get("is_error") else text


def _chat_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or "input_schema" not in tool:
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise Untranslatable(f"{where}.type", f"server tool {kind!r} has no Chat Completions equivalent")
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapping = {"auto": "auto", "any": "required", "none": "none"}
    if kind in mapping:
        return mapping[kind]
    raise Untranslatable("tool_choice", f"{choice!r} has no Chat Completions equivalent")


def from_chat_request(chat: dict[str, Any]) -> dict[str, Any]:
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(chat.get("messages") or []):
        role, where = message.get("role"), f"messages[{i}]"
        if role in ("system", "developer"):
            if messages:
                messages.append({"role": "system", "content": text_of(message.get("content"))})
            else:
                system.append(text_of(message.get("content")))
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                     "content": text_of(message.get("content"))}
            _user_blocks(messages).append(block)
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.get("content"):
                blocks.append({"type": "text", "text": text_of(message["content"])})
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                               "input": arguments_object(function.get("arguments"), f"{where}.tool_calls[{j}]")})
            messages.append({"role": "assistant", "content": blocks})
        else:
            content = message.get("content")
            if not isinstance(content, (str, type(None))) and not all(p.get("type") == "text" for p in content):
                raise Untranslatable(f"{where}.content", "only text user content is translated to Messages")
            _user_blocks(messages).append({"type": "text", "text": text_of(content)})
    body: dict[str, Any] = {"model": chat.get("model"), "messages": messages,
                            "max_tokens": chat.get("max_completion_tokens") or chat.get("max_tokens") or 4096}
    if system:
        body["system"] = "\n".join(system)
    for name, value in chat.items():
        if name == "tools":
            body["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                              "input_schema": t["function"].get("parameters") or {"type": "object"}}
                             for t in value or []]
        elif name == "tool_choice":
            body["tool_choice"] = ({"type": "tool", "name": value["function"]["name"]} if isinstance(value, dict)
                                   else {"type": {"required": "any"}.get(value, value)})
        elif name == "stop":
            body["stop_sequences"] = [value] if isinstance(value, str) else value
        elif name == "reasoning_effort":
            body["thinking"] = {"type": "adaptive"}
        elif name == "user":
            body["metadata"] = {"user_id": value}
        elif name in ("stream", "temperature", "top_p", "top_k"):
            body[name] = value
    return body


def _user_blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages or messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": []})
    return messages[-1]["content"]


# --------------------------------------------------------------------------- responses


def to_chat_response(body: dict[str, Any]) -> dict[str, Any]:
    message = _assistant_message([b for b in body.get("content") or [] if isinstance(b, dict)], "content")
    usage = body.get("usage") or None
    chat_usage = None
    if usage:
        prompt = sum(usage.get(k) or 0 for k in ("input_tokens", "cache_creation_input_tokens",
                                                  "cache_read_input_tokens"))
        completion = usage.get("output_tokens") or 0
        chat_usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        if usage.get("cache_read_input_tokens"):
            chat_usage["prompt_tokens_details"] = {"cached_tokens": usage["cache_read_input_tokens"]}
    return chat_response(
        response_id=str(body.get("id") or ""), model=body.get("model"), content=message["content"],
        reasoning=message.get("reasoning_content"), tool_calls=message.get("tool_calls") or [],
        finish=_STOP_TO_CHAT.get(body.get("stop_reason") or "", "stop"), usage=chat_usage)


def from_chat_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    choice, message, usage = chat_parts(chat)
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": text_of(message["content"])})
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                       "input": arguments_object(function.get("arguments"), f"choices[0].message.tool_calls[{j}]")})
    return {"id": f"msg_{chat.get('id') or ''}", "type": "message", "role": "assistant", "model": chat.get("model"),
            "content": blocks, "stop_reason": _CHAT_TO_STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": _messages_usage(usage)}


def _messages_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": (usage.get("prompt_tokens") or 0) - cached, "output_tokens": usage.get("completion_tokens") or 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def assemble(chunks: list[bytes]) -> Assembled:
    body: dict[str, Any] | None = None
    first, error = None, None
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for event in sse_events(chunks):
        data = parse_json_event(event.data)
        if data is None:
            error = error or f"malformed data line: {event.data[:200]!r}"
            continue
        kind = data.get("type") or event.event
        if kind == "message_start":
            body = dict(data.get("message") or {})
        elif kind == "content_block_start":
            blocks[int(data.get("index", len(blocks)))] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            first = event.chunk_index if first is None else first
            _merge_delta(blocks.setdefault(int(data.get("index", 0)), {}), partial, int(data.get("index", 0)),
                         data.get("delta") or {})
        elif kind == "message_delta" and body is not None:
            body.update({k: v for k, v in (data.get("delta") or {}).items() if v is not None})
            body["usage"] = {**(body.get("usage") or {}), **(data.get("usage") or {})}
        elif kind == "error":
            error = error or f"error event in stream: {(data.get('error') or {}).get('message')}"
    for index, text in partial.items():
        try:
            blocks[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            error = error or f"tool_use block {index} has input that is not JSON"
    if body is not None:
        body["content"] = [blocks[i] for i in sorted(blocks)]
    return Assembled(body, first, error)


def _merge_delta(block: dict[str, Any], partial: dict[int, str], index: int, delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + delta.get("signature", "")
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + delta.get("partial_json", "")


class Writer:
    """Chat chunks as Messages events: message_start, one content block at a time (thinking, text, each
    tool_use), message_delta with the stop reason and usage, message_stop."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._state = ChatStreamState()
        self._block: str | None = None  # the open block: "thinking", "text" or "call:<index>"
        self._index = -1

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        for delta in self._state.take(chunk):
            if not self._state.started:
                self._state.started = True
                out += self._start()
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out += self._delta({"type": "thinking_delta", "thinking": reasoning})
            if delta.get("content"):
                out += self._open("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                key = f"call:{call.get('index', 0)}"
                out += self._open(key, {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                                        "input": {}})
                if function.get("arguments"):
                    out += self._delta({"type": "input_json_delta", "partial_json": function["arguments"]})
        return out

    def _start(self) -> bytes:
        message: dict[str, Any] = {"id": f"msg_{self._state.response_id}", "type": "message", "role": "assistant",
                   "model": self._state.model, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return sse_bytes({"type": "message_start", "message": message}, "message_start")

    def _open(self, key: str, block: dict[str, Any]) -> bytes:
        if self._block == key:
            return b""
        out = self._close()
        self._block, self._index = key, self._index + 1
        return out + sse_bytes({"type": "content_block_start", "index": self._index, "content_block": block},
                               "content_block_start")

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return sse_bytes({"type": "content_block_stop", "index": self._index}, "content_block_stop")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_bytes({"type": "content_block_delta", "index": self._index, "delta": delta}, "content_block_delta")

    def finish(self) -> bytes:
        out = b"" if self._state.started else self._start()
        out += self._close()
        stop = _CHAT_TO_STOP.get(self._state.finish or "stop", "end_turn")
        usage = _messages_usage(self._state.usage)
        out += sse_bytes({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                          "usage": usage}, "message_delta")
        return out + sse_bytes({"type": "message_stop"}, "message_stop")


def error_body(code: str, message: str, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message, "code": code}}


def error_message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(error) if error else None


def count_tokens_estimate(body: dict[str, Any]) -> int:
    """For an endpoint without count_tokens (Chat Completions): characters / 4 of what would be sent."""
    return max(1, len(json.dumps({k: body.get(k) for k in ("system", "messages", "tools")})) // 4)
