"""The demo model over real HTTP in all four protocols, with tools: it works a demo task through whatever
shell-like tool the request offers (commands really run here, in a copy of the task's files), ends the way
each harness expects, streams the same answer it gives whole, and returns token ids and logprobs on request."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from workers.demo import wire
from workers.demo.tasks import get_demo_task

SCHEMA_COMMAND = {"type": "object", "properties": {"command": {"type": "string"},
                                                    "description": {"type": "string"}},
                  "required": ["command", "description"]}
SCHEMA_CMD = {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
              "required": ["cmd"]}
EDIT_TOOL = {"type": "object", "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"}}}


def _root(url: str) -> str:
    return url.removesuffix("/v1")


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _events(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            out.append(json.loads("\n".join(data)))
    return out


def _run(command: Any, workspace: Path) -> tuple[str, int]:
    argv = command if isinstance(command, list) else ["bash", "-c", command]
    done = subprocess.run(argv, cwd=workspace, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr, done.returncode


def _workspace(tmp_path: Path, key: str) -> Path:
    for path, text in get_demo_task(key).files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


class Chat:
    path = "/v1/chat/completions"

    def __init__(self, prompt: str, seed: int) -> None:
        self.body: dict[str, Any] = {
            "model": "m", "seed": seed,
            "messages": [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": prompt}],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA_COMMAND}}]}

    def turn(self, answer: dict) -> tuple[str, tuple[str, str, dict] | None, str]:
        message = answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        self.body["messages"].append(message)
        call = calls[0] if calls else None
        return (message["content"] or "", call and (call["id"], call["function"]["name"],
                                                    json.loads(call["function"]["arguments"])),
                answer["choices"][0]["finish_reason"])

    def result(self, call_id: str, output: str, code: int) -> None:
        self.body["messages"].append({"role": "tool", "tool_call_id": call_id, "content": f"{output}\nexit code: {code}"})


class Responses:
    path = "/v1/responses"

    def __init__(self, prompt: str, seed: int) -> None:
        # Codex's shape: developer instructions and context as messages, exec_command, store false
        self.body: dict[str, Any] = {
            "model": "m", "stream": False, "store": False, "prompt_cache_key": f"session-{seed}",
            "instructions": "You are Codex.", "parallel_tool_calls": False, "include": ["reasoning.encrypted_content"],
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": SCHEMA_CMD, "strict": False}]}

    def turn(self, answer: dict) -> tuple[str, tuple[str, str, dict] | None, str]:
        self.body["input"] += answer["output"]
        text = "".join(p["text"] for i in answer["output"] if i["type"] == "message" for p in i["content"])
        calls = [i for i in answer["output"] if i["type"] == "function_call"]
        call = calls[0] if calls else None
        return text, call and (call["call_id"], call["name"], json.loads(call["arguments"])), answer["status"]

    def result(self, call_id: str, output: str, code: int) -> None:
        self.body["input"].append({"type": "function_call_output", "call_id": call_id,
                                   "output": f"Process exited with code {code}\nOutput:\n{output}"})


class Messages:
    path = "/v1/messages?beta=true"

    def __init__(self, prompt: str, seed: int) -> None:
        # Claude Code's shape: system blocks, reminders in the first user turn, Bash among other tools
        self.body: dict[str, Any] = {
            "model": "m", "max_tokens": 32000, "metadata": {"user_id": json.dumps({"session_id": str(seed)})},
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                                      {"type": "text", "text": prompt}]}],
            "tools": [{"name": "Edit", "input_schema": EDIT_TOOL},
                      {"name": "Bash", "input_schema": SCHEMA_COMMAND}]}

    def turn(self, answer: dict) -> tuple[str, tuple[str, str, dict] | None, str]:
        self.body["messages"].append({"role": "assistant", "content": answer["content"]})
        text = "".join(b["text"] for b in answer["content"] if b["type"] == "text")
        calls = [b for b in answer["content"] if b["type"] == "tool_use"]
        call = calls[0] if calls else None
        return text, call and (call["id"], call["name"], call["input"]), answer["stop_reason"]

    def result(self, call_id: str, output: str, code: int) -> None:
        self.body["messages"].append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": output, "is_error": code != 0}]})
        # Claude Code puts a system message in the middle of the conversation
        self.body["messages"].append({"role": "system", "content": "reminder: keep going"})


class Gemini:
    path = "/v1beta/models/m:generateContent"

    def __init__(self, prompt: str, seed: int) -> None:
        self.body: dict[str, Any] = {
            "contents": [{"role": "user", "parts": [{"text": prompt}]}], "generationConfig": {"seed": seed},
            "systemInstruction": {"parts": [{"text": "You are gemini-cli."}]},
            "tools": [{"functionDeclarations": [{"name": "run_shell_command", "parameters": {
                "type": "OBJECT", "properties": {"command": {"type": "STRING"}}, "required": ["command"]}}]}]}

    def turn(self, answer: dict) -> tuple[str, tuple[str, str, dict] | None, str]:
        content = answer["candidates"][0]["content"]
        self.body["contents"].append(content)
        text = "".join(p.get("text", "") for p in content["parts"] if not p.get("thought"))
        calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
        call = calls[0] if calls else None
        return text, call and (call.get("id"), call["name"], call["args"]), answer["candidates"][0]["finishReason"]

    def result(self, call_id: str, output: str, code: int) -> None:
        self.body["contents"].append({"role": "user", "parts": [{"functionResponse": {
            "id": call_id, "name": "run_shell_command", "response": {"output": f"{output}\nExit Code: {code}"}}}]})


CLIENTS = {"chat": (Chat, "bash", "stop"), "responses": (Responses, "exec_command", "completed"),
           "messages": (Messages, "Bash", "end_turn"), "gemini": (Gemini, "run_shell_command", "STOP")}


def _work(url: str, client: Any, workspace: Path, turns: int = 30) -> tuple[list[str], str, str]:
    commands: list[str] = []
    for _ in range(turns):
        status, raw = _post(_root(url) + client.path, client.body)
        assert status == 200, raw
        text, call, finish = client.turn(json.loads(raw))
        if call is None:
            return commands, text, finish
        call_id, name, arguments = call
        command = arguments.get("command") or arguments.get("cmd")
        commands.append(name)
        output, code = _run(command, workspace)
        client.result(call_id, output, code)
    return commands, "", "budget"


@pytest.mark.parametrize("protocol", sorted(CLIENTS))
def test_the_model_works_a_task_through_the_requests_shell_tool_and_ends_with_an_answer(
    demo_model_url, tmp_path, protocol
):
    make, tool, final = CLIENTS[protocol]
    task = get_demo_task("slugify")
    endings = []
    for seed in range(3):
        workspace = _workspace(tmp_path / str(seed), "slugify")
        commands, text, finish = _work(demo_model_url, make(task.instruction, seed), workspace)
        assert commands and set(commands) == {tool}
        endings.append((finish, text))
    ended = [text for finish, text in endings if finish == final]
    assert ended and all(text and "TROVE_SUBMIT" not in text for text in ended)


def test_mini_swe_agent_ends_with_a_command_that_prints_its_marker(demo_model_url, tmp_path):
    client = Chat("Please migrate our billing service to Rust.", 1)
    client.body["messages"][0]["content"] = "When done, run: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    client.body["tools"] = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]

    commands = []
    for _ in range(2):
        _, raw = _post(_root(demo_model_url) + client.path, client.body)
        _, call, finish = client.turn(json.loads(raw))
        commands.append(call[2]["command"])
        client.result(call[0], "", 0)

    assert commands == ["ls -la", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"] and finish == "tool_calls"


def test_outcomes_stay_mixed_across_seeds(demo_model_url, tmp_path):
    task = get_demo_task("matrix_ops")
    passed = []
    for seed in range(10):
        workspace = _workspace(tmp_path / str(seed), "matrix_ops")
        _work(demo_model_url, Responses(task.instruction, seed), workspace, turns=14)
        passed.append(_run(task.test_command, workspace)[1] == 0)
    assert any(passed) and not all(passed)


def test_codex_shell_tool_with_an_array_command_gets_bash_lc(demo_model_url):
    client = Responses(get_demo_task("slugify").instruction, 0)
    client.body["tools"] = [{"type": "function", "name": "shell", "parameters": {
        "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"]}}]
    _, raw = _post(_root(demo_model_url) + client.path, client.body)
    _, call, _ = client.turn(json.loads(raw))
    assert call[1] == "shell" and call[2]["command"][:2] == ["bash", "-lc"]


def _same_answer_streamed(url: str, path: str, body: dict, stream_path: str | None = None) -> tuple[dict, list]:
    _, whole = _post(_root(url) + path, body)
    streamed_body = body if stream_path else {**body, "stream": True}
    _, raw = _post(_root(url) + (stream_path or path), streamed_body)
    return json.loads(whole), _events(raw)


def test_each_protocols_stream_adds_up_to_its_whole_answer(demo_model_url):
    prompt = get_demo_task("slugify").instruction
    chat = Chat(prompt, 2)
    whole, events = _same_answer_streamed(demo_model_url, chat.path, chat.body)
    arguments = "".join(e["choices"][0]["delta"].get("tool_calls", [{}])[0].get("function", {}).get("arguments", "")
                        for e in events if e["choices"])
    assert arguments == whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]

    responses = Responses(prompt, 2)
    whole, events = _same_answer_streamed(demo_model_url, responses.path, responses.body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert {"response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done", "response.output_text.delta"} <= set(kinds)
    def without_ids(items: list[dict]) -> list[dict]:
        return [{k: v for k, v in item.items() if k != "id"} for item in items]

    assert without_ids(events[-1]["response"]["output"]) == without_ids(whole["output"])
    assert events[-1]["response"]["usage"] == whole["usage"]

    messages = Messages(prompt, 2)
    whole, events = _same_answer_streamed(demo_model_url, messages.path, messages.body)
    partial = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    tool_use = [b for b in whole["content"] if b["type"] == "tool_use"][0]
    assert json.loads(partial) == tool_use["input"]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"

    gemini = Gemini(prompt, 2)
    whole, events = _same_answer_streamed(demo_model_url, gemini.path, gemini.body,
                                          "/v1beta/models/m:streamGenerateContent?alt=sse")
    text = "".join(p.get("text", "") for e in events for p in e["candidates"][0]["content"]["parts"])
    assert text == "".join(p.get("text", "") for p in whole["candidates"][0]["content"]["parts"])
    assert events[-1]["usageMetadata"] == whole["usageMetadata"]


def test_reasoning_is_returned_when_asked_for_in_each_protocol(demo_model_url):
    prompt = get_demo_task("slugify").instruction
    chat = Chat(prompt, 0)
    _, raw = _post(_root(demo_model_url) + chat.path, {**chat.body, "reasoning_effort": "low"})
    assert json.loads(raw)["choices"][0]["message"]["reasoning_content"]
    responses = Responses(prompt, 0)
    _, raw = _post(_root(demo_model_url) + responses.path, {**responses.body, "reasoning": {"summary": "auto"}})
    assert json.loads(raw)["output"][0]["type"] == "reasoning"
    messages = Messages(prompt, 0)
    _, raw = _post(_root(demo_model_url) + messages.path, {**messages.body, "thinking": {"type": "adaptive"}})
    assert json.loads(raw)["content"][0]["type"] == "thinking"
    gemini = Gemini(prompt, 0)
    body = {**gemini.body, "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    _, raw = _post(_root(demo_model_url) + gemini.path, body)
    assert json.loads(raw)["candidates"][0]["content"]["parts"][0]["thought"] is True


def test_token_ids_and_logprobs_come_from_a_deterministic_tokenizer(demo_model_url):
    chat = Chat(get_demo_task("slugify").instruction, 0)
    body = {**chat.body, "logprobs": True, "return_token_ids": True}
    first, again = (json.loads(_post(_root(demo_model_url) + chat.path, body)[1]) for _ in range(2))
    choice = first["choices"][0]
    tokens = choice["logprobs"]["content"]
    # One logprob per generated token: the content, the tool call as the template renders it, the end marker.
    assert "".join(t["token"] for t in tokens) == wire.turn_body(choice["message"]) + wire.IM_END
    assert all(t["logprob"] < 0 for t in tokens) and len(choice["token_ids"]) == len(tokens)
    assert choice["token_ids"][-1] == wire.SPECIAL_IDS[wire.IM_END]
    assert first["prompt_token_ids"] == wire.chat_prompt_tokens(body["messages"])
    assert choice == again["choices"][0] | {"message": choice["message"]}
    streamed = _events(_post(_root(demo_model_url) + chat.path, {**body, "stream": True})[1])
    ids = [i for e in streamed if e["choices"] for i in e["choices"][0].get("token_ids") or []]
    logprobs = [t for e in streamed if e["choices"] for t in (e["choices"][0].get("logprobs") or {}).get("content") or []]
    assert ids == choice["token_ids"] and logprobs == tokens
    assert streamed[0]["prompt_token_ids"] == first["prompt_token_ids"]


def test_token_ids_of_a_growing_conversation_chain_and_sglang_fields_put_the_prompt_in_the_choice(demo_model_url):
    """A call whose history only grew: its prompt ids begin with the last call's prompt and completion ids."""
    chat = Chat(get_demo_task("slugify").instruction, 0)
    body = {**chat.body, "return_token_ids": True}
    first = json.loads(_post(_root(demo_model_url) + chat.path, body)[1])
    message = first["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "slug.py\ntest_slug.py"}
    grown = {**body, "messages": [*body["messages"], message, result], "return_prompt_token_ids": True}
    second = json.loads(_post(_root(demo_model_url) + chat.path, grown)[1])
    before = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(before)] == before and len(second["prompt_token_ids"]) > len(before)
    assert second["choices"][0]["prompt_token_ids"] == second["prompt_token_ids"]
    edited = {**message, "content": message["content"] + " (edited)"}
    rerendered = json.loads(_post(_root(demo_model_url) + chat.path,
                                  {**grown, "messages": [*body["messages"], edited, result]})[1])
    assert rerendered["prompt_token_ids"][: len(before)] != before


def test_count_tokens_preconnect_and_protocol_shaped_errors(demo_model_url):
    root = _root(demo_model_url)
    status, raw = _post(root + "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(raw)["input_tokens"] > 0
    request = urllib.request.Request(root + "/", method="HEAD")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    status, raw = _post(root + "/v1/messages", {"messages": []})
    assert status == 400 and json.loads(raw)["type"] == "error"
    status, raw = _post(root + "/v1/responses", {"input": [{"type": "bogus"}]})
    assert status == 400 and "input[0].type" == json.loads(raw)["error"]["param"]
    status, raw = _post(root + "/v1beta/models/m:generateContent", {"contents": "x"})
    assert status == 400 and json.loads(raw)["error"]["code"] == 400


def _claude_tools(workspace: Path) -> Messages:
    client = Messages(get_demo_task("slugify").instruction, 0)
    client.body["system"].append({"type": "text", "text": f"Here is useful information about the environment:\n"
                                                          f"<env>\nWorking directory: {workspace}\n</env>"})
    client.body["tools"] = [
        {"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                                          "required": ["file_path"]}},
        {"name": "Edit", "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"}},
            "required": ["file_path", "old_string", "new_string"]}},
        {"name": "Bash", "input_schema": SCHEMA_COMMAND}]
    return client


def _claude_tool(name: str, arguments: dict, workspace: Path, read: set[str]) -> tuple[str, int]:
    """Read and Edit as Claude Code runs them: absolute paths, and no edit of a file not read first."""
    if name == "Bash":
        return _run(arguments["command"], workspace)
    path = Path(arguments["file_path"])
    assert path.is_absolute() and path.is_relative_to(workspace)
    if name == "Read":
        read.add(str(path))
        return "".join(f"{i:6}\t{line}" for i, line in enumerate(path.read_text().splitlines(True), 1)), 0
    if str(path) not in read:
        return "File has not been read yet. Read it first before writing to it.", 1
    text = path.read_text()
    if text.count(arguments["old_string"]) != 1:
        return "String to replace not found in file.", 1
    path.write_text(text.replace(arguments["old_string"], arguments["new_string"]))
    return f"The file {path} has been updated.", 0


def test_with_read_and_edit_tools_the_model_reads_and_edits_through_them(demo_model_url, tmp_path):
    task = get_demo_task("slugify")
    used, solved = set(), 0
    for seed in range(4):
        workspace = _workspace(tmp_path / str(seed), "slugify")
        client, read = _claude_tools(workspace), set()
        client.body["metadata"]["user_id"] = f"seed-{seed}"
        for _ in range(20):
            status, raw = _post(_root(demo_model_url) + client.path, client.body)
            assert status == 200, raw
            _, call, _ = client.turn(json.loads(raw))
            if call is None:
                break
            used.add(call[1])
            client.result(call[0], *_claude_tool(call[1], call[2], workspace, read))
        solved += _run(task.test_command, workspace)[1] == 0
    assert used == {"Read", "Edit", "Bash"} and solved >= 1


def test_without_a_working_directory_file_edits_go_through_the_shell(demo_model_url, tmp_path):
    client = _claude_tools(tmp_path)
    client.body["system"].pop()
    names = set()
    for _ in range(12):
        _, raw = _post(_root(demo_model_url) + client.path, client.body)
        _, call, _ = client.turn(json.loads(raw))
        if call is None:
            break
        names.add(call[1])
        client.result(call[0], *_run(call[2]["command"], _workspace(tmp_path, "slugify")))
    assert names == {"Bash"}


@pytest.mark.parametrize(("observation", "passed"), [
    ("exit code: 0\nOK", True), ("exit code: 1\nFAILED (failures=1)", False),  # Trove's built-in harness
    ("Process exited with code 0\nOutput:\nOK", True), ("Process exited with code 1\nOutput:\n", False),  # Codex
    ('{\n  "returncode": 0,\n  "output": "Ran 5 tests\\n\\nOK"\n}', True),  # mini-swe-agent
    ('{\n  "returncode": 1,\n  "output": "FAILED"\n}', False),
    ("Ran 5 tests in 0.001s\n\nOK", True), ("Ran 5 tests\n\nFAILED (errors=1)", False),  # Claude Code, opencode
])
def test_each_harness_s_tool_output_tells_whether_the_tests_passed(observation, passed):
    from workers.demo.policy import tests_passed

    assert tests_passed(observation) is passed
