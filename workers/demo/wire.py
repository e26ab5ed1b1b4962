"""The demo model's four wire protocols: read a request into the chat messages and tools the policy needs,
and write the policy's turn back as that protocol's answer, whole or as its stream of events.

Protocols: OpenAI Chat Completions (`chat`), OpenAI Responses (`responses`), Anthropic Messages
(`messages`) and the Gemini API (`gemini`). Each is written from that protocol's own shapes (not through
the proxy's translators), so the proxy's translation is checked against an independent implementation.

Everything is deterministic for a given request: tool-call ids come from the conversation, the tokenizer is
a word splitter with hashed ids. Token ids (chat, on request) come from a small ChatML-style template
(`chat_prompt_tokens`): each message is a text turn, tokenised on its own, so when a harness only appends
to its history a call's prompt ids begin with the previous call's prompt and completion ids, as they do
with a real server's template. It is a stand-in's tokenizer, not any model's. Reasoning is produced only when the request asks for it (chat
`reasoning_effort`, Responses `reasoning`, Messages `thinking`, Gemini `thinkingConfig.includeThoughts`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from workers.demo.policy import Tool, Turn

MODEL_ID = "trove-demo-stand-in"
VOCABULARY = 50_000


class BadRequest(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# --------------------------------------------------------------------------- the tokenizer


def pieces(text: str) -> list[str]:
    """Word-sized pieces, whitespace kept: the demo's tokens and its stream deltas."""
    return re.findall(r"\s*\S+|\s+", text)


def token_id(piece: str) -> int:
    return int.from_bytes(hashlib.sha256(piece.encode()).digest()[:4], "big") % VOCABULARY


def token_logprob(piece: str) -> float:
    return -round((token_id(piece) % 997) / 1000 + 0.001, 3)


# The template's turn markers: special ids outside the word vocabulary, never produced by a word.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_IDS = {IM_START: VOCABULARY, IM_END: VOCABULARY + 1}


def piece_id(piece: str) -> int:
    return SPECIAL_IDS.get(piece, token_id(piece))


def text_pieces(text: str) -> list[str]:
    return pieces(text) if text else []


def turn_body(message: dict[str, Any]) -> str:
    """A message's text in the template: reasoning (when the message carries it), content, then each tool
    call as `<tool_call>{"name": ..., "arguments": ...}</tool_call>` with the arguments as sent."""
    body = f"<think>{message['reasoning_content']}</think>" if message.get("reasoning_content") else ""
    body += _content_text(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        body += "<tool_call>" + json.dumps({"name": function.get("name"), "arguments": function.get("arguments")}) \
            + "</tool_call>"
    return body


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def turn_pieces(message: dict[str, Any]) -> list[str]:
    """One message as template pieces: `<|im_start|>role\n body <|im_end|> \n`, each part tokenised alone
    so that a turn's tokens never depend on its neighbours."""
    role = str(message.get("role") or "")
    return [IM_START, *text_pieces(f"{role}\n"), *text_pieces(turn_body(message)), IM_END, "\n"]


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> list[int]:
    """The prompt's ids: every message's turn, then the generation prompt `<|im_start|>assistant\n`."""
    ids = [piece_id(piece) for message in messages for piece in turn_pieces(message)]
    return ids + [piece_id(piece) for piece in [IM_START, *text_pieces("assistant\n")]]


def completion_pieces(reply: Reply) -> list[str]:
    """What the stand-in generates for a chat turn: the body of the assistant message it answers with, and
    the end-of-turn marker (the newline after it is the template's, in the next prompt)."""
    return [*text_pieces(turn_body(chat_message(reply))), IM_END]


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    # characters / 4, plus a few per message for the chat template
    return 3 + sum(4 + count_tokens(_flat(m.get("content"))) for m in messages)


def _flat(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content or "")


@dataclass(frozen=True)
class Reply:
    """The policy's turn made concrete for one request: text, an optional tool call with its id, the
    reasoning (when asked for), why it stopped, and token counts."""

    text: str
    reasoning: str | None
    call_id: str | None
    tool_name: str | None
    arguments: dict[str, Any] | None
    finish: str  # stop | tool_calls | length
    prompt_tokens: int

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments or {})

    @property
    def completion_tokens(self) -> int:
        extra = count_tokens(self.arguments_json) if self.tool_name else 0
        return count_tokens(self.text) + extra + (count_tokens(self.reasoning) if self.reasoning else 0)


def make_reply(
    turn: Turn, messages: list[dict[str, Any]], *, reasoning: bool, limit: int | None
) -> Reply:
    text, finish = turn.text, "tool_calls" if turn.tool_call else "stop"
    if limit is not None and count_tokens(text) > limit:
        return Reply(text[: limit * 4], None, None, None, None, "length", prompt_tokens(messages))
    call = turn.tool_call
    call_id = _call_id(messages, call.name, call.arguments) if call else None
    thought = f"Next step: {text.splitlines()[0]}" if reasoning and text else None
    return Reply(text, thought, call_id, call.name if call else None, call.arguments if call else None, finish,
                 prompt_tokens(messages))


def _call_id(messages: list[dict[str, Any]], name: str, arguments: dict[str, Any]) -> str:
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    digest = hashlib.sha256(f"{turns}\x00{name}\x00{json.dumps(arguments, sort_keys=True)}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


# --------------------------------------------------------------------------- Chat Completions


def chat_read(body: Any) -> tuple[list[dict[str, Any]], list[Tool]]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
    tools = []
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools.append(Tool(function["name"], function.get("parameters") or {}))
    return messages, tools


def chat_message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_name:
        message["tool_calls"] = [{"id": reply.call_id, "type": "function",
                                  "function": {"name": reply.tool_name, "arguments": reply.arguments_json}}]
    return message


def chat_usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def chat_logprobs(tokens: list[str]) -> dict[str, Any]:
    """Logprobs of generated pieces: one entry per completion token (tool-call text and the end marker
    included), as a server reports them for every token it sampled."""
    return {"content": [{"token": p, "logprob": token_logprob(p), "bytes": list(p.encode()), "top_logprobs": []}
                        for p in tokens]}


def chat_completion(body: dict[str, Any], reply: Reply, response_id: str) -> dict[str, Any]:
    generated = completion_pieces(reply)
    choice: dict[str, Any] = {"index": 0, "message": chat_message(reply),
                              "logprobs": chat_logprobs(generated) if body.get("logprobs") else None,
                              "finish_reason": reply.finish}
    completion: dict[str, Any] = {"id": response_id, "object": "chat.completion", "created": int(time.time()),
                                  "model": MODEL_ID, "system_fingerprint": MODEL_ID, "choices": [choice],
                                  "usage": chat_usage(reply)}
    if body.get("return_token_ids"):  # vLLM's and SGLang's switch: the completion's token ids
        choice["token_ids"] = [piece_id(p) for p in generated]
        completion["prompt_token_ids"] = chat_prompt_tokens(body["messages"])  # vLLM's place for them
    if body.get("return_prompt_token_ids"):  # SGLang's: the prompt's ids, in the choice
        choice["prompt_token_ids"] = chat_prompt_tokens(body["messages"])
    return completion


def generation_record(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """What the stand-in generated for a chat call, as it keeps it (`make_app(generations=...)`): the
    prompt ids, the completion ids and their logprobs, whatever the request asked to see."""
    generated = completion_pieces(reply)
    return {"prompt_ids": chat_prompt_tokens(body["messages"]), "ids": [piece_id(p) for p in generated],
            "logprobs": [token_logprob(p) for p in generated]}


def chat_stream(body: dict[str, Any], reply: Reply, response_id: str) -> list[bytes]:
    base = {"id": response_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": MODEL_ID,
            "system_fingerprint": MODEL_ID}
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    extra = {"usage": None} if include_usage else {}
    with_logprobs, with_ids = bool(body.get("logprobs")), bool(body.get("return_token_ids"))
    # The completion's tokens, handed out in order: one with each content delta, the rest (tool-call
    # markup, the end marker) with the last chunk, so that the chunks' tokens add up to the whole.
    generated = completion_pieces(reply)
    given = {"upto": 0}

    def chunk(delta: dict[str, Any], finish: str | None = None, tokens: int = 0) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        taken = generated[given["upto"]: given["upto"] + tokens] if tokens >= 0 else generated[given["upto"]:]
        given["upto"] += len(taken)
        if taken and with_logprobs:
            choice["logprobs"] = chat_logprobs(taken)
        if taken and with_ids:
            choice["token_ids"] = [piece_id(p) for p in taken]
        return sse({**base, "choices": [choice], **extra})

    first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}], **extra}
    if with_ids:  # vLLM sends the prompt's ids with the first chunk
        first["prompt_token_ids"] = chat_prompt_tokens(body["messages"])
    events = [sse(first)]
    if reply.reasoning:
        events += [chunk({"reasoning_content": p}) for p in pieces(reply.reasoning)]
    events += [chunk({"content": p}, tokens=1) for p in pieces(reply.text)]
    if reply.tool_name:
        head = {"index": 0, "id": reply.call_id, "type": "function",
                "function": {"name": reply.tool_name, "arguments": ""}}
        events.append(chunk({"tool_calls": [head]}))
        events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                   for p in _json_pieces(reply.arguments_json)]
    events.append(chunk({}, reply.finish, tokens=-1))
    if include_usage:
        events.append(sse({**base, "choices": [], "usage": chat_usage(reply)}))
    events.append(b"data: [DONE]\n\n")
    return events


def _json_pieces(text: str, size: int = 16) -> list[str]:
    return [text[i: i + size] for i in range(0, len(text), size)] or [""]


# --------------------------------------------------------------------------- Responses


def responses_read(body: Any) -> tuple[list[dict[str, Any]], list[Tool]]:
    """The Responses input as chat messages: consecutive model-side items (a message, reasoning, function
    calls) are one assistant turn; a function_call_output is a tool message."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a string or a non-empty list", param="input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", param=f"input[{i}]")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                _assistant(messages)["content"] += _responses_text(item.get("content"))
            else:
                messages.append({"role": "system" if role == "developer" else role,
                                 "content": _responses_text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call", "reasoning"):
            _assistant(messages)
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _responses_text(item.get("output"))})
        else:
            raise BadRequest(f"input[{i}] has an unknown type {kind!r}", param=f"input[{i}].type")
    tools = [Tool(t["name"], t.get("parameters") or {}) for t in body.get("tools") or []
             if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)]
    return messages, tools


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _responses_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def responses_items(reply: Reply, response_id: str, *, logprobs: bool) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append({"type": "reasoning", "id": f"rs_{response_id[5:]}",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    if reply.text:
        part: dict[str, Any] = {"type": "output_text", "text": reply.text, "annotations": []}
        if logprobs:
            part["logprobs"] = [{"token": p, "logprob": token_logprob(p), "bytes": list(p.encode()),
                                 "top_logprobs": []} for p in pieces(reply.text)]
        items.append({"type": "message", "id": f"msg_{response_id[5:]}", "status": "completed",
                      "role": "assistant", "content": [part]})
    if reply.tool_name:
        items.append({"type": "function_call", "id": f"fc_{response_id[5:]}", "status": "completed",
                      "call_id": reply.call_id, "name": reply.tool_name, "arguments": reply.arguments_json})
    return items


def responses_body(body: dict[str, Any], reply: Reply, response_id: str, *, done: bool = True) -> dict[str, Any]:
    logprobs = "message.output_text.logprobs" in (body.get("include") or [])
    usage = {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": reply.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": count_tokens(reply.reasoning) if reply.reasoning else 0},
             "total_tokens": reply.prompt_tokens + reply.completion_tokens}
    status = ("incomplete" if reply.finish == "length" else "completed") if done else "in_progress"
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
            "model": MODEL_ID, "output": responses_items(reply, response_id, logprobs=logprobs) if done else [],
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)), "tool_choice": "auto",
            "tools": body.get("tools") or [], "store": bool(body.get("store", False)),
            "incomplete_details": {"reason": "max_output_tokens"} if done and reply.finish == "length" else None,
            "usage": usage if done else None}


def responses_stream(body: dict[str, Any], reply: Reply, response_id: str) -> list[bytes]:
    events: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        events.append(sse({"type": kind, "sequence_number": len(events), **data}, kind))

    emit("response.created", response=responses_body(body, reply, response_id, done=False))
    emit("response.in_progress", response=responses_body(body, reply, response_id, done=False))
    final = responses_body(body, reply, response_id)
    for index, item in enumerate(final["output"]):
        if item["type"] == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            emit("response.reasoning_summary_part.added", item_id=item["id"], output_index=index, summary_index=0,
                 part={"type": "summary_text", "text": ""})
            for piece in pieces(reply.reasoning or ""):
                emit("response.reasoning_summary_text.delta", item_id=item["id"], output_index=index,
                     summary_index=0, delta=piece)
            emit("response.reasoning_summary_text.done", item_id=item["id"], output_index=index, summary_index=0,
                 text=reply.reasoning)
            emit("response.reasoning_summary_part.done", item_id=item["id"], output_index=index, summary_index=0,
                 part=item["summary"][0])
        elif item["type"] == "message":
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "content": []})
            emit("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                 part={"type": "output_text", "text": "", "annotations": []})
            for piece in pieces(reply.text):
                emit("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                     delta=piece)
            emit("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                 text=reply.text)
            emit("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                 part=item["content"][0])
        else:
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            for piece in _json_pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
            emit("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                 arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
    return events


# --------------------------------------------------------------------------- Anthropic Messages


def messages_read(body: Any) -> tuple[list[dict[str, Any]], list[Tool]]:
    """Messages as chat messages: tool_result blocks become tool messages, a role:"system" message in the
    middle (Claude Code sends one) stays a system message there."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    messages: list[dict[str, Any]] = []
    system = _anthropic_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"messages.{i} must have role user, assistant or system", param=f"messages.{i}.role")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        texts = []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                 "content": _anthropic_text(block.get("content"))})
            elif isinstance(block, dict) and block.get("type") == "text":
                texts.append(str(block.get("text", "")))
        if message["role"] == "assistant" or texts:
            messages.append({"role": message["role"], "content": "\n".join(texts)})
    tools = [Tool(t["name"], t.get("input_schema") or {}) for t in body.get("tools") or []
             if isinstance(t, dict) and isinstance(t.get("name"), str) and "input_schema" in t]
    return messages, tools


def _anthropic_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def messages_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": "trove-demo-stand-in"})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    if reply.tool_name:
        blocks.append({"type": "tool_use", "id": reply.call_id, "name": reply.tool_name,
                       "input": reply.arguments or {}})
    return blocks


def messages_body(reply: Reply, response_id: str) -> dict[str, Any]:
    return {"id": response_id, "type": "message", "role": "assistant", "model": MODEL_ID,
            "content": messages_blocks(reply), "stop_reason": _STOP_REASONS[reply.finish], "stop_sequence": None,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def messages_stream(reply: Reply, response_id: str) -> list[bytes]:
    final = messages_body(reply, response_id)
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 1}}
    events = [sse({"type": "message_start", "message": start}, "message_start"), sse({"type": "ping"}, "ping")]

    def emit(kind: str, **data: Any) -> None:
        events.append(sse({"type": kind, **data}, kind))

    for index, block in enumerate(final["content"]):
        if block["type"] == "thinking":
            emit("content_block_start", index=index, content_block={"type": "thinking", "thinking": "", "signature": ""})
            for piece in pieces(block["thinking"]):
                emit("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": piece})
            emit("content_block_delta", index=index, delta={"type": "signature_delta", "signature": block["signature"]})
        elif block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for piece in pieces(block["text"]):
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        else:
            emit("content_block_start", index=index,
                 content_block={"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
            for piece in _json_pieces(json.dumps(block["input"])):
                emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
        emit("content_block_stop", index=index)
    emit("message_delta", delta={"stop_reason": final["stop_reason"], "stop_sequence": None},
         usage={"output_tokens": final["usage"]["output_tokens"]})
    emit("message_stop")
    return events


# --------------------------------------------------------------------------- Gemini


def gemini_read(body: Any) -> tuple[list[dict[str, Any]], list[Tool]]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise BadRequest("'contents' must be a non-empty list", param="contents")
    messages: list[dict[str, Any]] = []
    system = _gemini_text((body.get("systemInstruction") or {}).get("parts"))
    if system:
        messages.append({"role": "system", "content": system})
    for i, content in enumerate(contents):
        if not isinstance(content, dict):
            raise BadRequest(f"contents[{i}] must be an object", param=f"contents[{i}]")
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
        if content.get("role") == "model":
            messages.append({"role": "assistant", "content": _gemini_text(parts)})
            continue
        for part in parts:
            if isinstance(part.get("functionResponse"), dict):
                response = part["functionResponse"].get("response")
                messages.append({"role": "tool", "tool_call_id": part["functionResponse"].get("id"),
                                 "content": _gemini_output(response)})
        text = _gemini_text(parts)
        if text:
            messages.append({"role": "user", "content": text})
    tools = []
    for group in body.get("tools") or []:
        for declaration in (group or {}).get("functionDeclarations") or []:
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                schema = declaration.get("parametersJsonSchema") or declaration.get("parameters") or {}
                tools.append(Tool(declaration["name"], _lower_types(schema)))
    return messages, tools


def _gemini_text(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    return "\n".join(str(p["text"]) for p in parts if isinstance(p, dict) and "text" in p and not p.get("thought"))


def _gemini_output(response: Any) -> str:
    if isinstance(response, dict) and isinstance(response.get("output"), str):
        return response["output"]
    return json.dumps(response)


def _lower_types(schema: Any) -> Any:
    """Gemini's OpenAPI schemas spell types in capitals (STRING, OBJECT)."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


_FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}


def gemini_parts(reply: Reply) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if reply.reasoning:
        parts.append({"text": reply.reasoning, "thought": True})
    if reply.text:
        parts.append({"text": reply.text})
    if reply.tool_name:
        parts.append({"functionCall": {"id": reply.call_id, "name": reply.tool_name, "args": reply.arguments or {}}})
    return parts


def gemini_usage(reply: Reply) -> dict[str, int]:
    usage = {"promptTokenCount": reply.prompt_tokens, "candidatesTokenCount": reply.completion_tokens,
             "totalTokenCount": reply.prompt_tokens + reply.completion_tokens}
    if reply.reasoning:
        usage["thoughtsTokenCount"] = count_tokens(reply.reasoning)
    return usage


def gemini_body(reply: Reply, response_id: str) -> dict[str, Any]:
    candidate = {"content": {"role": "model", "parts": gemini_parts(reply)},
                 "finishReason": _FINISH_REASONS[reply.finish], "index": 0}
    return {"candidates": [candidate], "usageMetadata": gemini_usage(reply), "modelVersion": MODEL_ID,
            "responseId": response_id}


def gemini_stream(reply: Reply, response_id: str) -> list[bytes]:
    def chunk(parts: list[dict[str, Any]], **extra: Any) -> bytes:
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0, **extra}
        return sse({"candidates": [candidate], "modelVersion": MODEL_ID, "responseId": response_id})

    events = [chunk([{"text": p, "thought": True}]) for p in pieces(reply.reasoning or "")]
    events += [chunk([{"text": p}]) for p in pieces(reply.text)]
    tail = [part for part in gemini_parts(reply) if "functionCall" in part]
    final = {"candidates": [{"content": {"role": "model", "parts": tail}, "index": 0,
                             "finishReason": _FINISH_REASONS[reply.finish]}],
             "usageMetadata": gemini_usage(reply), "modelVersion": MODEL_ID, "responseId": response_id}
    events.append(sse(final))
    return events
