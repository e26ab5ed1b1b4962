"""The Gemini API (what gemini-cli speaks): `POST /r/<token>/v1beta/models/<model>:generateContent` and
`:streamGenerateContent?alt=sse`; upstream `{base_url}/models/<model>:<method>` (a base URL ending in
`/v1beta`), key in `x-goog-api-key`.

Parts: `text` (with `thought: true` for reasoning), `functionCall` / `functionResponse`. Gemini links a
response to its call by name (and by `id` when the caller sets one); the normalised form needs ids, so a
call without one gets `<name>:<n>` (its position among the conversation's calls), and a response the
same id as the earliest unanswered call of that name.
"""

from __future__ import annotations

import json
from typing import Any

from webapp.proxy.protocols.base import (
    Assembled,
    ChatStreamState,
    Untranslatable,
    arguments_object,
    chat_finish,
    chat_parts,
    chat_response,
    parse_json_event,
    sse_bytes,
    sse_events,
    text_of,
)

NAME = "gemini"
ROUTES = (("POST", "/v1beta/models/{call}"),)
_METHODS = ("generateContent", "streamGenerateContent")
_FINISH_TO_CHAT = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter"}


def upstream_path(body: dict[str, Any], stream: bool) -> str:
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/models/{body.get('model') or 'model'}:{method}"


def split_call(call: str) -> tuple[str, str] | None:
    """`<model>:<method>` from the route, or None when it names no Gemini method the proxy serves."""
    model, _, method = call.partition(":")
    return (model, method) if model and method in _METHODS else None


def is_stream(body: dict[str, Any], path: str) -> bool:
    return ":streamGenerateContent" in path


def set_model(body: dict[str, Any], model: str) -> None:
    body["model"] = model  # kept beside the body by the route (Gemini names the model in the path)


def auth_headers(key: str) -> dict[str, str]:
    return {"x-goog-api-key": key} if key else {}


# --------------------------------------------------------------------------- requests


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = (body.get("systemInstruction") or body.get("system_instruction") or {}).get("parts")
    if system:
        messages.append({"role": "system", "content": _text(system, False)})
    ids = _CallIds()
    for i, content in enumerate(body.get("contents") or []):
        messages += _chat_messages(content, f"contents[{i}]", ids)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = []
    for i, group in enumerate(body.get("tools") or []):
        for key in group or {}:
            if key not in ("functionDeclarations", "function_declarations"):
                raise Untranslatable(f"tools[{i}].{key}", "only function declarations have a Chat Completions equivalent")
        for declaration in (group or {}).get("functionDeclarations") or (group or {}).get("function_declarations") or []:
            schema = declaration.get("parametersJsonSchema") or _lower_types(declaration.get("parameters")) or {
                "type": "object", "properties": {}}
            function = {"name": declaration.get("name"), "parameters": schema}
            if declaration.get("description"):
                function["description"] = declaration["description"]
            tools.append({"type": "function", "function": function})
    if tools:
        chat["tools"] = tools
    config = body.get("generationConfig") or {}
    for name, value in config.items():
        if name == "maxOutputTokens":
            chat["max_tokens"] = value
        elif name == "stopSequences":
            chat["stop"] = value
        elif name in ("temperature", "seed"):
            chat[name] = value
        elif name == "topP":
            chat["top_p"] = value
        elif name == "topK":
            chat["top_k"] = value
        elif name == "thinkingConfig":
            if (value or {}).get("includeThoughts"):
                chat["reasoning_effort"] = "medium"
        elif name == "responseLogprobs":
            chat["logprobs"] = bool(value)
        elif name == "candidateCount":
            if value != 1:
                raise Untranslatable("generationConfig.candidateCount", "only one candidate is translated")
        elif name in ("responseMimeType",) and value == "text/plain":
            continue
        else:
            raise Untranslatable(f"generationConfig.{name}", "no Chat Completions equivalent")
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


class _CallIds:
    def __init__(self) -> None:
        self.count = 0
        self.open: list[tuple[str, str]] = []  # (name, id) of calls not yet answered, in order

    def call(self, part: dict[str, Any]) -> str:
        self.count += 1
        call_id = part.get("id") or f"{part.get('name')}:{self.count}"
        self.open.append((str(part.get("name")), call_id))
        return call_id

    def response(self, part: dict[str, Any]) -> str | None:
        for index, (name, call_id) in enumerate(self.open):
            if (part.get("id") and call_id == part["id"]) or (not part.get("id") and name == part.get("name")):
                del self.open[index]
                return call_id
        return part.get("id")


def _chat_messages(content: Any, where: str, ids: _CallIds) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise Untranslatable(where, "a content must be an object")
    parts = content.get("parts") or []
    if content.get("role") == "model":
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            if "functionCall" in part:
                call = part["functionCall"]
                calls.append({"id": ids.call(call), "type": "function",
                              "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args") or {})}})
            elif "text" in part:
                (reasoning if part.get("thought") else text).append(str(part["text"]))
            elif "thoughtSignature" not in part:
                raise Untranslatable(f"{where}.parts[{j}]", "only text and functionCall parts are translated")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        return [message]
    out: list[dict[str, Any]] = []
    texts = []
    for j, part in enumerate(parts):
        if "functionResponse" in part:
            response = part["functionResponse"]
            out.append({"role": "tool", "tool_call_id": ids.response(response),
                        "content": _response_text(response.get("response"))})
        elif "text" in part:
            texts.append(str(part["text"]))
        else:
            raise Untranslatable(f"{where}.parts[{j}]", "only text and functionResponse parts are translated")
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _response_text(response: Any) -> str:
    if isinstance(response, dict) and set(response) <= {"output", "error"}:
        return str(response.get("output") if "output" in response else response.get("error"))
    return json.dumps(response)


def _text(parts: Any, thought: bool) -> str:
    return "".join(str(p["text"]) for p in parts or [] if isinstance(p, dict) and "text" in p
                   and bool(p.get("thought")) == thought)


def _lower_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def from_chat_request(chat: dict[str, Any]) -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    system = []
    names: dict[str, str] = {}  # tool call id -> function name (a functionResponse carries the name)
    for i, message in enumerate(chat.get("messages") or []):
        role = message.get("role")
        if role in ("system", "developer"):
            system.append({"text": text_of(message.get("content"))})
        elif role == "assistant":
            parts: list[dict[str, Any]] = []
            if message.get("content"):
                parts.append({"text": text_of(message["content"])})
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") or {}
                names[str(call.get("id"))] = str(function.get("name"))
                parts.append({"functionCall": {"id": call.get("id"), "name": function.get("name"),
                              "args": arguments_object(function.get("arguments"), f"messages[{i}].tool_calls[{j}]")}})
            contents.append({"role": "model", "parts": parts})
        elif role == "tool":
            part = {"functionResponse": {"id": message.get("tool_call_id"),
                                         "name": names.get(str(message.get("tool_call_id")), "tool"),
                                         "response": {"output": text_of(message.get("content"))}}}
            _user_parts(contents).append(part)
        else:
            _user_parts(contents).append({"text": text_of(message.get("content"))})
    body: dict[str, Any] = {"model": chat.get("model"), "contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    if chat.get("tools"):
        body["tools"] = [{"functionDeclarations": [
            {"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parametersJsonSchema": t["function"].get("parameters") or {"type": "object"}} for t in chat["tools"]]}]
    config: dict[str, Any] = {}
    for name, key in (("max_tokens", "maxOutputTokens"), ("max_completion_tokens", "maxOutputTokens"),
                      ("temperature", "temperature"), ("top_p", "topP"), ("seed", "seed")):
        if chat.get(name) is not None:
            config[key] = chat[name]
    if chat.get("stop"):
        config["stopSequences"] = [chat["stop"]] if isinstance(chat["stop"], str) else chat["stop"]
    if chat.get("reasoning_effort"):
        config["thinkingConfig"] = {"includeThoughts": True}
    if config:
        body["generationConfig"] = config
    if chat.get("stream"):
        body["stream"] = True
    return body


def _user_parts(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not contents or contents[-1]["role"] != "user":
        contents.append({"role": "user", "parts": []})
    return contents[-1]["parts"]


def upstream_body(body: dict[str, Any]) -> dict[str, Any]:
    """What is sent to a Gemini endpoint: the body without the proxy's own `model` and `stream` keys."""
    return {k: v for k, v in body.items() if k not in ("model", "stream")}


# --------------------------------------------------------------------------- responses


def to_chat_response(body: dict[str, Any]) -> dict[str, Any]:
    candidates = body.get("candidates") or [{}]
    candidate = candidates[0] if isinstance(candidates[0], dict) else {}
    parts = (candidate.get("content") or {}).get("parts") or []
    calls = []
    for index, part in enumerate(p for p in parts if isinstance(p, dict) and "functionCall" in p):
        call = part["functionCall"]
        calls.append({"id": call.get("id") or f"{call.get('name')}:{index + 1}", "type": "function",
                      "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args") or {})}})
    usage = body.get("usageMetadata") or None
    chat_usage = None
    if usage:
        prompt = usage.get("promptTokenCount") or 0
        completion = (usage.get("candidatesTokenCount") or 0) + (usage.get("thoughtsTokenCount") or 0)
        chat_usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    finish = candidate.get("finishReason")
    return chat_response(
        response_id=str(body.get("responseId") or ""), model=body.get("modelVersion"),
        content=_text(parts, False) or None, reasoning=_text(parts, True) or None, tool_calls=calls,
        finish=_FINISH_TO_CHAT.get(finish, "stop") if finish not in (None, "STOP") else chat_finish(bool(calls), False),
        usage=chat_usage)


def from_chat_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    choice, message, usage = chat_parts(chat)
    return {"candidates": [{"content": {"role": "model", "parts": _parts(message)}, "index": 0,
                            "finishReason": "MAX_TOKENS" if choice.get("finish_reason") == "length" else "STOP"}],
            "usageMetadata": _gemini_usage(usage), "modelVersion": chat.get("model"), "responseId": chat.get("id")}


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        parts.append({"text": message["reasoning_content"], "thought": True})
    if message.get("content"):
        parts.append({"text": text_of(message["content"])})
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        parts.append({"functionCall": {"id": call.get("id"), "name": function.get("name"),
                      "args": arguments_object(function.get("arguments"), f"choices[0].message.tool_calls[{j}]")}})
    return parts


def _gemini_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


def assemble(chunks: list[bytes]) -> Assembled:
    """Gemini's stream is whole GenerateContentResponse objects: parts concatenate (text with text of the
    same kind), the last finishReason and usageMetadata win."""
    body: dict[str, Any] | None = None
    parts: list[dict[str, Any]] = []
    first, error = None, None
    for event in sse_events(chunks):
        data = parse_json_event(event.data)
        if data is None:
            error = error or f"malformed data line: {event.data[:200]!r}"
            continue
        if "error" in data:
            error = error or f"error event in stream: {(data.get('error') or {}).get('message')}"
            continue
        body = body or {k: v for k, v in data.items() if k != "candidates"}
        body.update({k: v for k, v in data.items() if k in ("usageMetadata", "modelVersion", "responseId")})
        candidate = (data.get("candidates") or [{}])[0]
        new = (candidate.get("content") or {}).get("parts") or []
        if new and first is None:
            first = event.chunk_index
        for part in new:
            last = parts[-1] if parts else None
            if last is not None and "text" in part and "text" in last and bool(last.get("thought")) == bool(part.get("thought")):
                last["text"] += part["text"]
            else:
                parts.append(dict(part))
        if candidate.get("finishReason"):
            body["finishReason"] = candidate["finishReason"]
    if body is not None:
        finish = body.pop("finishReason", None)
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        body["candidates"] = [candidate]
    return Assembled(body, first, error)


class Writer:
    """Chat chunks as Gemini stream chunks: text as it comes, function calls whole once their arguments
    are complete (Gemini sends `args` as an object), usage and finishReason in the last chunk."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._state = ChatStreamState()

    def _chunk(self, parts: list[dict[str, Any]], **extra: Any) -> bytes:
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        return sse_bytes({"candidates": [candidate], "modelVersion": self._state.model,
                          "responseId": self._state.response_id, **extra})

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        for delta in self._state.take(chunk):
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self._chunk([{"text": reasoning, "thought": True}])
            if delta.get("content"):
                out += self._chunk([{"text": delta["content"]}])
            for call in delta.get("tool_calls") or []:
                held = self._state.tool_calls.setdefault(call.get("index", 0), {"arguments": ""})
                function = call.get("function") or {}
                held.setdefault("id", call.get("id"))
                held["name"] = held.get("name") or function.get("name")
                held["arguments"] += function.get("arguments") or ""
        return out

    def finish(self) -> bytes:
        parts = [{"functionCall": {"id": call.get("id"), "name": call.get("name"),
                                   "args": arguments_object(call["arguments"], f"tool_calls[{index}].arguments")}}
                 for index, call in sorted(self._state.tool_calls.items())]
        finish = "MAX_TOKENS" if self._state.finish == "length" else "STOP"
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0, "finishReason": finish}
        return sse_bytes({"candidates": [candidate], "usageMetadata": _gemini_usage(self._state.usage),
                          "modelVersion": self._state.model, "responseId": self._state.response_id})


def error_body(code: str, message: str, error_type: str = "proxy_error") -> dict[str, Any]:
    return {"error": {"code": 0, "message": message, "status": code.upper()}}


def error_message(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(error) if error else None
