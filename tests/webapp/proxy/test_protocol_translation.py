"""Every protocol through the real proxy to the real demo model: passed through to an endpoint of the same
protocol, translated for a Chat Completions endpoint (and a chat client for endpoints of the others), with
Codex-shaped and Claude-Code-shaped bodies (../shared/HARNESSES.md); the normalised records of a translated
call and a pass-through call of the same conversation are the same; a field with no equivalent is refused
with its name and recorded as an error step."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.webapp.proxy.protocol_harness import (
    UPSTREAM_KEY,
    ProtocolProxy,
    new_call_id,
    post,
    sse_data,
)
from workers.demo.tasks import get_demo_task

PROMPT = get_demo_task("slugify").instruction
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
               "required": ["command"]}
CLAUDE_HEADERS = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
                  "anthropic-version": "2023-06-01", "x-api-key": "harness-side-dummy"}


def codex_body(turn: int = 0) -> dict[str, Any]:
    """The fields Codex sends (HARNESSES.md): the whole input each turn, store false, no previous_response_id."""
    body: dict[str, Any] = {
        "model": "gpt-5-codex", "instructions": "You are Codex, a coding agent.", "stream": True,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]},
        ],
        "tools": [{"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}],
        "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-session-1",
        "client_metadata": {"x-codex-turn": "1"},
    }
    if turn:
        body["input"] += [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look around first."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing files."}]},
            {"type": "function_call", "call_id": "call_a", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "Process exited with code 0\nslugify.py"},
        ]
    return body


def claude_body(turn: int = 0) -> dict[str, Any]:
    """Claude Code's fields (HARNESSES.md): adaptive thinking, context_management, output_config, a JSON
    string user_id, and after the first turn a role: "system" message in the middle of messages."""
    body: dict[str, Any] = {
        "model": "claude-sonnet", "max_tokens": 32000, "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>context</system-reminder>"},
            {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": BASH_SCHEMA},
                  {"name": "Edit", "description": "Edit a file", "input_schema": {
                      "type": "object", "properties": {"file_path": {"type": "string"}}}}],
        "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "output_config": {"effort": "medium"}, "metadata": {"user_id": json.dumps({"session_id": "s-1"})},
    }
    if turn:
        body["messages"] += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look around first.", "signature": "sig"},
                {"type": "text", "text": "Listing files."},
                {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "slugify.py"}]},
            {"role": "system", "content": "Reminder: the todo list is empty."},
        ]
    return body


def gemini_body(turn: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
        "systemInstruction": {"parts": [{"text": "You are gemini-cli."}]},
        "tools": [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run a command",
                                             "parameters": {"type": "OBJECT", "properties": {
                                                 "command": {"type": "STRING"}}, "required": ["command"]}}]}],
        "generationConfig": {"temperature": 0, "seed": 7, "thinkingConfig": {"includeThoughts": True}},
    }
    if turn:
        body["contents"] += [
            {"role": "model", "parts": [{"text": "Listing files."},
                                        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command",
                                                             "response": {"output": "slugify.py"}}}]},
        ]
    return body


def chat_body(turn: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m", "seed": 3, "stream": True, "stream_options": {"include_usage": True}, "reasoning_effort": "low",
        "messages": [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": PROMPT}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": BASH_SCHEMA}}],
    }
    if turn:
        body["messages"] += [
            {"role": "assistant", "content": "Listing files.", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "slugify.py"},
        ]
    return body


BODIES = {"responses": codex_body, "messages": claude_body, "gemini": gemini_body, "chat": chat_body}


def _without_stream(protocol: str, body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def _call(proxy: ProtocolProxy, client: str, endpoint: str, body: dict[str, Any], *, stream: bool):
    call_id = new_call_id()
    sent = body if stream or client == "gemini" else _without_stream(client, body)
    headers = CLAUDE_HEADERS if client == "messages" else None
    reply = post(proxy.url(client, endpoint, stream=stream and client == "gemini"), sent, headers=headers,
                 call_id=call_id)
    return reply, proxy.record(call_id)


def _normalised_answer(record) -> dict[str, Any]:
    """The normalised response as a model would be trained on it: ids of the response itself left out."""
    choice = record.response["choices"][0]
    message = choice["message"]
    return {"content": message.get("content"), "reasoning": message.get("reasoning_content"),
            "tool_calls": [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                           for c in message.get("tool_calls") or []],
            "finish": choice["finish_reason"]}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("turn", [0, 1])
@pytest.mark.parametrize("client", ["responses", "messages", "gemini"])
def test_a_translated_call_and_a_pass_through_call_give_the_same_normalised_record(
    protocol_proxy: ProtocolProxy, client: str, turn: int, stream: bool
):
    body = BODIES[client](turn)

    passed_reply, passed = _call(protocol_proxy, client, client, body, stream=stream)
    translated_reply, translated = _call(protocol_proxy, client, "chat", body, stream=stream)

    assert passed_reply.status == translated_reply.status == 200, translated_reply.body[:300]
    assert (passed.protocol, passed.upstream_protocol) == (client, client)
    assert (translated.protocol, translated.upstream_protocol) == (client, "chat")
    assert not passed.is_error and not translated.is_error, (passed.error, translated.error)
    assert passed.request == translated.request
    assert _normalised_answer(passed) == _normalised_answer(translated)
    assert _normalised_answer(passed)["tool_calls"] and _normalised_answer(passed)["reasoning"]
    assert passed.usage["completion_tokens"] > 0 and translated.usage["completion_tokens"] > 0
    if stream:
        assert passed.ttft_ms is not None and translated.ttft_ms is not None
    # the raw exchange: the client's bytes, and the upstream's when translated
    assert json.loads(translated.raw["request"]) == (body if stream or client == "gemini" else _without_stream(client, body))
    assert translated.raw["upstream"]["protocol"] == "chat" and "messages" in json.loads(translated.raw["upstream"]["request"])
    assert translated.raw["response"].encode() == translated_reply.body
    assert passed.raw["response"].encode() == passed_reply.body


def test_a_multi_turn_record_links_tool_calls_and_results_by_call_id(protocol_proxy: ProtocolProxy):
    for client in ("responses", "messages", "gemini", "chat"):
        _, record = _call(protocol_proxy, client, client, BODIES[client](1), stream=False)
        messages = record.request["messages"]
        [assistant] = [m for m in messages if m.get("tool_calls")]
        [result] = [m for m in messages if m["role"] == "tool"]
        assert result["tool_call_id"] == assistant["tool_calls"][0]["id"], client
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) in ({"cmd": "ls"}, {"command": "ls"})
        step = record.to_step_record()
        assert step.request_messages[-1].role in ("tool", "system") and step.tool_calls
        assert step.payload.get("protocol", "chat") == client


def test_claude_codes_mid_conversation_system_message_stays_a_system_message_in_place(protocol_proxy):
    _, record = _call(protocol_proxy, "messages", "chat", claude_body(1), stream=True)
    roles = [m["role"] for m in record.request["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "system"]


@pytest.mark.parametrize("endpoint", ["responses", "messages", "gemini"])
def test_a_chat_client_is_translated_for_an_endpoint_of_each_other_protocol(protocol_proxy, endpoint):
    for stream in (False, True):
        reply, record = _call(protocol_proxy, "chat", endpoint, chat_body(1), stream=stream)
        assert reply.status == 200 and not record.is_error, record.error
        if stream:
            chunks = sse_data(reply.body)
            assert reply.body.endswith(b"data: [DONE]\n\n") and chunks[-1]["usage"]["completion_tokens"] > 0
            arguments = "".join(c["choices"][0]["delta"].get("tool_calls", [{}])[0].get("function", {})
                                .get("arguments", "") for c in chunks if c["choices"])
            assert json.loads(arguments)["command"]
        else:
            message = reply.json()["choices"][0]["message"]
            assert message["tool_calls"][0]["function"]["name"] == "bash"
        assert record.upstream_protocol == endpoint and record.response["choices"][0]["message"]["tool_calls"]


def test_claude_code_headers_reach_a_messages_endpoint_and_its_own_key_does_not(protocol_proxy: ProtocolProxy):
    scripted = protocol_proxy.scripted
    scripted.mode, scripted.chunks, scripted.content_type = "replay", [], "application/json"
    scripted.body = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "x", "content": [
        {"type": "text", "text": "hi"}], "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()
    before = len(scripted.requests)

    reply = post(protocol_proxy.url("messages", "messages", "scripted"), _without_stream("messages", claude_body()),
                 headers=CLAUDE_HEADERS)

    assert reply.status == 200
    [sent] = scripted.requests[before:]
    assert sent["path"] == "/v1/messages?beta=true"
    assert sent["headers"]["anthropic-beta"] == CLAUDE_HEADERS["anthropic-beta"]
    assert sent["headers"]["x-api-key"] == UPSTREAM_KEY and "Authorization" not in sent["headers"]


def test_head_preconnect_and_count_tokens(protocol_proxy: ProtocolProxy):
    base = protocol_proxy.base_url
    for endpoint in ("messages", "chat"):
        head = post(f"{base}/r/tok-messages-{endpoint}-demo/", method="HEAD", raw=b"")
        assert head.status == 200
        counted = post(f"{base}/r/tok-messages-{endpoint}-demo/v1/messages/count_tokens",
                       {"model": "m", "messages": [{"role": "user", "content": PROMPT}]})
        assert counted.status == 200 and counted.json()["input_tokens"] > 0
    assert post(f"{base}/r/unknown-token/", method="HEAD", raw=b"").status == 401


@pytest.mark.parametrize(("client", "mutate", "field"), [
    ("responses", lambda b: b["tools"].append({"type": "web_search"}), "tools[1].type"),
    ("responses", lambda b: b.update(previous_response_id="resp_1"), "previous_response_id"),
    ("messages", lambda b: b["tools"].append({"type": "web_search_20250305", "name": "web_search"}), "tools[2].type"),
    ("messages", lambda b: b["messages"][0]["content"].append({"type": "document", "source": {}}),
     "messages[0].content[2]"),
    ("gemini", lambda b: b["tools"].append({"googleSearch": {}}), "tools[1].googleSearch"),
    ("gemini", lambda b: b["generationConfig"].update(candidateCount=2), "generationConfig.candidateCount"),
])
def test_what_cannot_be_translated_is_refused_naming_the_field_and_recorded_as_an_error_step(
    protocol_proxy: ProtocolProxy, client, mutate, field
):
    body = _without_stream(client, BODIES[client]())
    mutate(body)

    reply, record = _call(protocol_proxy, client, "chat", body, stream=False)

    assert reply.status == 400 and field in reply.body.decode()
    assert record.error_kind == "untranslatable" and field in record.error
    step = record.to_step_record()
    assert step.is_error and step.payload["error_kind"] == "untranslatable"


def test_errors_come_back_in_the_clients_protocol(protocol_proxy: ProtocolProxy):
    reply = post(protocol_proxy.url("messages", "chat"), {"model": "m", "messages": "not a list"})
    assert reply.status == 400 and reply.json()["type"] == "error" and "messages[0]" in reply.json()["error"]["message"]
    reply = post(protocol_proxy.url("gemini", "gemini"), raw=b"[1, 2]")
    assert reply.status == 400 and reply.json()["error"]["status"] == "INVALID_REQUEST"
    reply = post(protocol_proxy.url("responses", "responses"), {"model": "m", "input": [{"type": "bogus"}]})
    assert reply.status == 400 and reply.json()["error"]["param"] == "input[0].type"  # the demo model's own


def test_gemini_count_tokens_is_estimated_not_recorded_and_unknown_methods_are_404(protocol_proxy: ProtocolProxy):
    base = f"{protocol_proxy.base_url}/r/tok-gemini-gemini-demo/v1beta/models/demo"
    protocol_proxy.sink.flush(5)  # the records of earlier tests' calls
    before = len(protocol_proxy.records)
    counted = post(f"{base}:countTokens", {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]})
    assert counted.status == 200 and counted.json()["totalTokens"] > 0 and counted.json()["trove_estimate"]
    protocol_proxy.sink.flush(5)
    assert len(protocol_proxy.records) == before
    call_id = new_call_id()
    unknown = post(f"{base}:embedContent", {"content": {}}, call_id=call_id)
    assert unknown.status == 404 and "embedContent" in unknown.json()["error"]["message"]
    assert protocol_proxy.record(call_id).error_kind == "invalid_request"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_token_ids_and_logprobs_the_upstream_returns_are_recorded(protocol_proxy: ProtocolProxy, stream: bool):
    body = {**chat_body(), "logprobs": True, "return_token_ids": True, "stream": stream}
    reply, record = _call(protocol_proxy, "chat", "chat", body, stream=stream)
    assert reply.status == 200
    step = record.to_step_record()
    logprobs = step.payload["logprobs"]
    # The demo model reports a logprob for every token it generated: its reasoning, text and tool call as
    # its template renders them (workers/demo/wire.py), not the text alone.
    generated = "".join(t["token"] for t in logprobs)
    assert step.response_text in generated and all(t["logprob"] < 0 for t in logprobs)
    assert len(step.payload["token_ids"]) == len(logprobs)
    if not stream:
        assert step.payload["prompt_token_ids"]

    codex = {**codex_body(), "include": ["message.output_text.logprobs"], "stream": stream}
    _, passed = _call(protocol_proxy, "responses", "responses", codex, stream=stream)
    _, translated = _call(protocol_proxy, "responses", "chat", codex, stream=stream)
    for record in (passed, translated):
        tokens = record.to_step_record().payload["logprobs"]
        assert record.response["choices"][0]["message"]["content"] in "".join(t["token"] for t in tokens)



@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("client", "endpoint"), [("responses", "messages"), ("messages", "responses"),
                                                  ("gemini", "messages"), ("messages", "gemini")])
def test_a_call_between_two_protocols_neither_of_them_chat_is_translated_both_ways(
    protocol_proxy: ProtocolProxy, client: str, endpoint: str, stream: bool
):
    # Codex against an Anthropic endpoint, Claude Code against a Responses one: through Chat Completions both
    # ways. The demo model upstream answers the merged turns of another protocol with another seed, so the
    # answer is checked for what it is, not against the pass-through's.
    body = BODIES[client](1)

    _, passed = _call(protocol_proxy, client, client, body, stream=stream)
    reply, translated = _call(protocol_proxy, client, endpoint, body, stream=stream)

    assert reply.status == 200, reply.body[:300]
    assert (translated.protocol, translated.upstream_protocol) == (client, endpoint)
    assert not translated.is_error, translated.error
    assert translated.request == passed.request, "the record holds what the harness sent, whatever went upstream"
    assert translated.raw["upstream"]["protocol"] == endpoint and translated.raw["response"].encode() == reply.body
    (call_id, name, arguments), = _normalised_answer(translated)["tool_calls"]
    offered = {tool["function"]["name"] for tool in translated.request["tools"]}
    assert name in offered and arguments and name.encode() in reply.body
    if client != "gemini":  # Gemini's function calls carry no id
        assert call_id.encode() in reply.body, "the harness gets the tool call under the id the record links"
    assert translated.usage["completion_tokens"] > 0
