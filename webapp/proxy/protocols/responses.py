"""OpenAI Responses (what Codex speaks): `POST /r/<token>/v1/responses`; upstream `{base_url}/responses`.

Stateless use only, as Codex calls it: `store: false` and the whole input re-sent each turn. An input
item is a message, a `function_call`, a `function_call_output` or a `reasoning` item; a stream is typed
SSE events ending in `response.completed` (or `.incomplete` / `.failed`), whose `response` is the whole body.
"""

from __future__ import annotations

import json
import time
from typing import Any

from webapp.proxy.protocols.base import (
    Assembled,
    ChatStreamState,
    Untranslatable,
    bearer_auth_headers,
    body_stream_flag,
    chat_finish,
    chat_parts,
    chat_response,
    parse_json_event,
    set_body_model,
    sse_bytes,
    sse_events,
    text_of,
)

NAME = "responses"
ROUTES = (("POST", "/v1/responses"),)
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_CONTENT_EVENTS = ("response.output_text.delta", "response.function_call_arguments.delta",
                   "response.reasoning_summary_text.delta", "response.reasoning_text.delta")
# Request fields that only steer the hosted service (caching, storage, client bookkeeping): dropped when the
# call goes to a Chat Completions endpoint. Any other field the translation does not know is refused.
_SERVICE_FIELDS = frozenset({"store", "include", "client_metadata", "metadata", "service_tier",
                             "safety_identifier", "truncation", "background", "stream_options"})


def upstream_path(body: dict[str, Any], stream: bool) -> str:
    return "/responses"


is_stream = body_stream_flag


set_model = set_body_model


auth_headers = bearer_auth_headers


# --------------------------------------------------------------------------- requests


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("previous_response_id"):
        raise Untranslatable("previous_response_id", "a Chat Completions endpoint keeps no conversation state; "
                             "send the whole input each turn (store: false)")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body)}
    for name, value in body.items():
        if name in ("model", "input", "instructions", "previous_response_id") or name in _SERVICE_FIELDS:
            continue
        if name == "tools":
            chat["tools"] = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(value or [])]
        elif name == "tool_choice":
            chat["tool_choice"] = _chat_tool_choice(value)
        elif name == "max_output_tokens":
            chat["max_tokens"] = value
        elif name == "reasoning":
            # Codex sends {summary} without an effort: it still asks for reasoning
            if isinstance(value, dict) and value.get("effort") != "none":
                chat["reasoning_effort"] = value.get("effort") or "medium"
        elif name == "text":
            if isinstance(value, dict) and (value.get("format") or {}).get("type", "text") != "text":
                raise Untranslatable("text.format", "structured output formats are not translated")
        elif name in ("stream", "temperature", "top_p", "parallel_tool_calls", "top_logprobs", "seed", "user",
                      "prompt_cache_key"):
            chat[name] = value
        else:
            raise Untranslatable(name, "no Chat Completions equivalent")
    if "message.output_text.logprobs" in (body.get("include") or []):
        chat["logprobs"] = True
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": text_of(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    reasoning: list[str] = []
    for i, item in enumerate(items or []):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise Untranslatable(where, "an input item must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                assistant = _assistant(messages, reasoning)
                assistant["content"] = (assistant["content"] or "") + _text_parts(item.get("content"), where)
            else:
                messages.append({"role": "system" if role == "developer" else role,
                                 "content": _user_content(item.get("content"), where)})
        elif kind == "function_call":
            assistant = _assistant(messages, reasoning)
            assistant.setdefault("tool_calls", []).append({
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text_parts(output, where)})
        elif kind == "reasoning":
            reasoning.append("".join(text_of(s.get("text")) for s in item.get("summary") or [] if isinstance(s, dict)))
        else:
            raise Untranslatable(f"{where}.type", f"input items of type {kind!r} have no Chat Completions equivalent")
    return messages


def _assistant(messages: list[dict[str, Any]], reasoning: list[str]) -> dict[str, Any]:
    """The assistant message this item belongs to: consecutive model-side items are one turn."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": None})
    if reasoning:
        messages[-1]["reasoning_content"] = (messages[-1].get("reasoning_content") or "") + "".join(reasoning)
        reasoning.clear()
    return messages[-1]


def _text_parts(content: Any, where: str) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    out = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text", "refusal"):
            raise Untranslatable(f"{where}.content[{j}]", "only text parts are translated here")
        out.append(str(part.get("text") or part.get("refusal") or ""))
    return "".join(out)


def _user_content(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content or []):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image" and part.get("image_url"):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise Untranslatable(f"{where}.content[{j}]", f"content parts of type {kind!r} are not translated")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _chat_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise Untranslatable(f"{where}.type", f"{kind!r} tools have no Chat Completions equivalent "
                             "(only function tools)")
    function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise Untranslatable("tool_choice", f"{choice!r} has no Chat Completions equivalent")


def from_chat_request(chat: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": chat.get("model"), "input": [], "store": False}
    for i, message in enumerate(chat.get("messages") or []):
        role = message.get("role")
        if role == "tool":
            body["input"].append({"type": "function_call_output", "call_id": message.get("tool_call_id"),
                                  "output": text_of(message.get("content"))})
            continue
        if role == "assistant":
            if message.get("content"):
                body["input"].append({"type": "message", "role": "assistant",
                                      "content": [{"type": "output_text", "text": text_of(message["content"])}]})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                body["input"].append({"type": "function_call", "call_id": call.get("id"),
                                      "name": function.get("name"), "arguments": function.get("arguments") or ""})
            continue
        if not isinstance(message.get("content"), (str, type(None))) and role != "user":
            raise Untranslatable(f"messages[{i}].content", "only text is translated for system messages")
        body["input"].append({"type": "message", "role": "developer" if role == "system" else role,
                              "content": _input_parts(message.get("content"), f"messages[{i}].content")})
    for name, value in chat.items():
        if name == "tools":
            body["tools"] = [{"type": "function", "name": t["function"]["name"],
                              "description": t["function"].get("description", ""),
                              "parameters": t["function"].get("parameters") or {"type": "object"}}
                             for t in value or []]
        elif name in ("max_tokens", "max_completion_tokens"):
            body["max_output_tokens"] = value
        elif name == "reasoning_effort":
            body["reasoning"] = {"effort": value, "summary": "auto"}
        elif name == "tool_choice":
            body["tool_choice"] = ({"type": "function", "name": value["function"]["name"]}
                                   if isinstance(value, dict) else value)
        elif name in ("stream", "temperature", "top_p", "parallel_tool_calls"):
            body[name] = value
    return body


def _input_parts(content: Any, where: str) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            parts.append({"type": "input_image", "image_url": (part.get("image_url") or {}).get("url")})
        else:
            raise Untranslatable(f"{where}[{j}]", f"content parts of type {part.get('type')!r} are not translated")
    return parts


# --------------------------------------------------------------------------- responses


def to_chat_response(body: dict[str, Any]) -> dict[str, Any]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[Any] = []
    for item in body.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                text.append(str(part.get("text") or part.get("refusal") or ""))
                logprobs += part.get("logprobs") or []
        elif item.get("type") == "reasoning":
            reasoning += [text_of(s.get("text")) for s in item.get("summary") or [] if isinstance(s, dict)]
        elif item.get("type") == "function_call":
            calls.append({"id": item.get("call_id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}})
    usage = body.get("usage") or None
    chat_usage = None
    if usage:
        chat_usage = {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens"),
                      "total_tokens": usage.get("total_tokens")}
    return chat_response(
        response_id=str(body.get("id") or ""), model=body.get("model"), content="".join(text) or None,
        reasoning="".join(reasoning) or None, tool_calls=calls, usage=chat_usage,
        finish=chat_finish(bool(calls), body.get("status") == "incomplete"),
        logprobs={"content": logprobs} if logprobs else None, created=int(body.get("created_at") or 0))


def from_chat_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    choice, message, usage = chat_parts(chat)
    response_id = f"resp_{chat.get('id') or ''}"
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content") or message.get("reasoning"):
        output.append({"type": "reasoning", "id": f"rs_{response_id}", "summary": [
            {"type": "summary_text", "text": message.get("reasoning_content") or message.get("reasoning")}]})
    if message.get("content"):
        part: dict[str, Any] = {"type": "output_text", "text": text_of(message["content"]), "annotations": []}
        if (choice.get("logprobs") or {}).get("content"):
            part["logprobs"] = choice["logprobs"]["content"]
        output.append({"type": "message", "id": f"msg_{response_id}", "status": "completed", "role": "assistant",
                       "content": [part]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        output.append({"type": "function_call", "id": f"fc_{index}_{response_id}", "status": "completed",
                       "call_id": call.get("id"), "name": function.get("name"),
                       "arguments": function.get("arguments") or ""})
    truncated = choice.get("finish_reason") == "length"
    return {"id": response_id, "object": "response", "created_at": chat.get("created") or int(time.time()),
            "status": "incomplete" if truncated else "completed", "model": chat.get("model"), "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "usage": _responses_usage(usage)}


def _responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + completion}


def assemble(chunks: list[bytes]) -> Assembled:
    """The terminal event's `response`; without one (a broken stream), the items that were done."""
    body, first, error = None, None, None
    items: dict[int, dict[str, Any]] = {}
    created: dict[str, Any] = {}
    for event in sse_events(chunks):
        data = parse_json_event(event.data)
        if data is None:
            error = error or f"malformed data line: {event.data[:200]!r}"
            continue
        kind = data.get("type") or event.event
        if kind in _CONTENT_EVENTS and first is None:
            first = event.chunk_index
        if kind == "response.created":
            created = data.get("response") or {}
        elif kind == "response.output_item.done":
            items[int(data.get("output_index", len(items)))] = data.get("item") or {}
        elif kind in _TERMINAL:
            body = data.get("response")
            if kind == "response.failed":
                error = error or f"error event in stream: {((body or {}).get('error') or {}).get('message')}"
        elif kind == "error":
            error = error or f"error event in stream: {data.get('message') or data.get('error')}"
    if body is None and (created or items):
        body = {**created, "output": [items[i] for i in sorted(items)]}
    return Assembled(body, first, error)


class Writer:
    """Chat chunks as Responses events: created, then each output item opened when its first delta comes
    (reasoning, message, function calls), closed at the end, then `response.completed` with usage."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._state = ChatStreamState()
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # output items in order, each with its accumulated text
        self._open: dict[str, int] = {}  # "reasoning" / "message" / "call:<index>" -> position in _items
        self._response_id = ""

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return sse_bytes(payload, kind)

    def _shell(self, status: str) -> dict[str, Any]:
        return {"id": self._response_id, "object": "response", "created_at": int(time.time()), "status": status,
                "model": self._state.model, "output": [], "usage": None}

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        for delta in self._state.take(chunk):
            if not self._state.started:
                self._state.started = True
                self._response_id = f"resp_{self._state.response_id}"
                out += self._event("response.created", response=self._shell("in_progress"))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self._text("reasoning", reasoning)
            if delta.get("content"):
                out += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
        return out

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        if kind not in self._open:
            index = len(self._items)
            self._open[kind] = index
            item: dict[str, Any]
            if kind == "reasoning":
                item = {"type": "reasoning", "id": f"rs_{index}_{self._response_id}", "summary": []}
                self._items.append({**item, "_text": ""})
                out += self._event("response.output_item.added", output_index=index, item=item)
                out += self._event("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                                   summary_index=0, part={"type": "summary_text", "text": ""})
            else:
                item = {"type": "message", "id": f"msg_{index}_{self._response_id}", "status": "in_progress",
                        "role": "assistant", "content": []}
                self._items.append({**item, "_text": ""})
                out += self._event("response.output_item.added", output_index=index, item=item)
                out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        index = self._open[kind]
        item = self._items[index]
        item["_text"] += text
        if kind == "reasoning":
            return out + self._event("response.reasoning_summary_text.delta", item_id=item["id"], output_index=index,
                                     summary_index=0, delta=text)
        return out + self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                 content_index=0, delta=text)

    def _call(self, call: dict[str, Any]) -> bytes:
        key = f"call:{call.get('index', 0)}"
        function = call.get("function") or {}
        out = b""
        if key not in self._open:
            index = len(self._items)
            self._open[key] = index
            item = {"type": "function_call", "id": f"fc_{index}_{self._response_id}", "status": "in_progress",
                    "call_id": call.get("id"), "name": function.get("name"), "arguments": ""}
            self._items.append({**item, "_text": ""})
            out += self._event("response.output_item.added", output_index=index, item=item)
        index = self._open[key]
        item = self._items[index]
        if function.get("arguments"):
            item["_text"] += function["arguments"]
            out += self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                               delta=function["arguments"])
        return out

    def finish(self) -> bytes:
        out = b""
        if not self._state.started:
            self._response_id = f"resp_{self._state.response_id}"
            out += self._event("response.created", response=self._shell("in_progress"))
        done_items = []
        for index, item in enumerate(self._items):
            text = item.pop("_text")
            if item["type"] == "reasoning":
                part = {"type": "summary_text", "text": text}
                out += self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                                   summary_index=0, text=text)
                out += self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                                   summary_index=0, part=part)
                item["summary"] = [part]
            elif item["type"] == "message":
                part = {"type": "output_text", "text": text, "annotations": []}
                if self._state.logprobs:
                    part["logprobs"] = self._state.logprobs
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=text)
                out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=part)
                item.update(status="completed", content=[part])
            else:
                out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   arguments=text)
                item.update(status="completed", arguments=text)
            out += self._event("response.output_item.done", output_index=index, item=item)
            done_items.append(item)
        truncated = self._state.finish == "length"
        final = {**self._shell("incomplete" if truncated else "completed"), "output": done_items,
                 "usage": _responses_usage(self._state.usage),
                 "incomplete_details": {"reason": "max_output_tokens"} if truncated else None}
        return out + self._event("response.incomplete" if truncated else "response.completed", response=final)


def error_body(code: str, message: str, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def error_message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(error) if error else None
