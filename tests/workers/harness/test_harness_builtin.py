"""The built-in harness loop: budgets, corrections, hooks and errors, against the demo model server and a
real subprocess executor (canned replies only where a real model would not produce the case)."""

from __future__ import annotations

import json
import socket
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workers.demo.tasks import get_demo_task
from workers.harness.builtin import (
    FINISH_MARKER,
    NO_COMMAND_MESSAGE,
    SYSTEM_PROMPT,
    ChatReply,
    ModelCallError,
    openai_chat,
    run_builtin_harness,
)
from workers.sandboxes.base import AgentUnavailable

MODEL = "trove-demo-stand-in"


def _canned(*replies: str):
    """A chat callable that plays back fixed replies (for reply shapes the demo model never sends)."""
    queue = list(replies)
    seen: list[list[dict]] = []

    def chat(messages: list[dict]) -> ChatReply:
        seen.append(messages)
        return ChatReply(content=queue.pop(0), usage={"prompt_tokens": 10, "completion_tokens": 5})

    chat.seen = seen  # type: ignore[attr-defined]
    return chat


def test_the_step_budget_cuts_a_run_off(demo_model_url, task_workspace):
    task = get_demo_task("json_path")
    execute = task_workspace(task)

    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(demo_model_url, MODEL, seed=0),
        execute=execute,
        max_steps=3,
        seed=0,
    )

    assert (outcome.finished, outcome.reason, outcome.steps, outcome.commands) == (False, "step_budget", 3, 3)
    assert [m["role"] for m in outcome.messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert outcome.messages[0]["content"] == SYSTEM_PROMPT
    assert task.instruction in outcome.messages[1]["content"]
    assert outcome.messages[-1]["content"].startswith("exit code: 0")
    assert outcome.prompt_tokens > 0 and outcome.completion_tokens > 0 and outcome.seed == 0


def test_a_reply_without_a_command_gets_a_correction_and_counts_as_a_step(task_workspace):
    chat = _canned("I think the bug is in wrap().", "```bash\necho hello\n```", f"Done.\n{FINISH_MARKER}")

    outcome = run_builtin_harness(
        instruction="fix it", chat=chat, execute=task_workspace(get_demo_task("word_wrap")), max_steps=10
    )

    assert (outcome.finished, outcome.reason, outcome.steps, outcome.commands) == (True, "submitted", 3, 1)
    assert outcome.messages[3] == {"role": "user", "content": NO_COMMAND_MESSAGE}
    assert outcome.messages[5]["content"] == "exit code: 0\n--- stdout ---\nhello\n"
    assert len(chat.seen[2]) == 6  # the model saw its own replies, the correction and the observation


def test_only_the_first_of_several_command_blocks_runs(task_workspace):
    execute = task_workspace(get_demo_task("slugify"))
    chat = _canned("```bash\ntouch first\n```\n```bash\ntouch second\n```", FINISH_MARKER)

    outcome = run_builtin_harness(instruction="x", chat=chat, execute=execute, max_steps=5)

    assert execute.exists("first") and not execute.exists("second")
    assert "only the first was run" in outcome.messages[3]["content"]
    assert outcome.commands == 1


def test_hooks_see_every_command_and_message(demo_model_url, task_workspace):
    task = get_demo_task("roman_numerals")
    commands, messages = [], []

    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(demo_model_url, MODEL, seed=2),
        execute=task_workspace(task),
        max_steps=20,
        seed=2,
        on_command=lambda cmd, result, started, ended: commands.append((cmd, result, started, ended)),
        on_message=messages.append,
    )

    assert len(commands) == outcome.commands > 0
    assert messages == outcome.messages
    for cmd, _result, started, ended in commands:
        assert isinstance(started, datetime) and started.tzinfo is not None and started <= ended
        assert cmd in "".join(m["content"] for m in outcome.messages if m["role"] == "assistant")
    reproduce = next(result for cmd, result, _, _ in commands if "unittest" in cmd)
    assert reproduce.exit_code == 1 and "FAILED" in reproduce.stderr


def test_a_failing_model_endpoint_ends_the_run_with_a_permanent_model_error(demo_model_url, task_workspace):
    chat = openai_chat(demo_model_url + "/no-such-path", MODEL, seed=1)

    outcome = run_builtin_harness(
        instruction="x", chat=chat, execute=task_workspace(get_demo_task("slugify")), max_steps=5
    )

    assert (outcome.finished, outcome.reason, outcome.steps) == (False, "model_error", 0)
    assert isinstance(outcome.exception, ModelCallError)
    assert outcome.exception.status == 404 and outcome.exception.permanent
    assert "404" in outcome.error


def test_an_unreachable_endpoint_is_a_transient_model_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    chat = openai_chat(f"http://127.0.0.1:{port}/v1", MODEL, retries=0, timeout=5)

    with pytest.raises(ModelCallError) as caught:
        chat([{"role": "user", "content": "hi"}])

    assert caught.value.status is None and not caught.value.permanent


class _FlakyUpstream(BaseHTTPRequestHandler):
    """Answers 503 once, then a valid completion: the edge of the world a retry exists for."""

    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        if len(self.bodies) == 1:
            self._send(503, {"error": {"message": "warming up"}}, {"Retry-After": "0"})
        else:
            reply = {
                "id": "c1",
                "model": "m",
                "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
            self._send(200, reply, {})

    def _send(self, status, payload, headers):
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            **headers,
        }.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_openai_chat_retries_a_transient_5xx_and_sends_the_seed():
    _FlakyUpstream.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        chat = openai_chat(f"http://127.0.0.1:{server.server_port}/v1", "m", "key", seed=42, retries=1)
        reply = chat([{"role": "user", "content": "hi"}])
    finally:
        server.shutdown()
        server.server_close()

    assert reply == ChatReply(
        content="ok",
        finish_reason="stop",
        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        model="m",
        id="c1",
    )
    assert len(_FlakyUpstream.bodies) == 2
    assert all(b["seed"] == 42 and b["model"] == "m" and not b["stream"] for b in _FlakyUpstream.bodies)


def test_the_token_budget_stops_the_run(demo_model_url, task_workspace):
    task = get_demo_task("pagination")

    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(demo_model_url, MODEL, seed=1),
        execute=task_workspace(task),
        max_steps=20,
        max_total_tokens=1,
    )

    assert (outcome.finished, outcome.reason, outcome.steps) == (False, "token_budget", 1)


def test_should_stop_ends_the_run_with_its_reason(demo_model_url, task_workspace):
    task = get_demo_task("pagination")
    turns = iter(range(100))

    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(demo_model_url, MODEL, seed=1),
        execute=task_workspace(task),
        max_steps=20,
        should_stop=lambda: "time_budget" if next(turns) >= 2 else None,
    )

    assert (outcome.finished, outcome.reason, outcome.steps) == (False, "time_budget", 2)


def test_a_sandbox_failure_ends_the_run_with_sandbox_error(demo_model_url):
    def execute(cmd: str):
        raise AgentUnavailable("agent did not answer")

    task = get_demo_task("slugify")
    outcome = run_builtin_harness(
        instruction=task.instruction,
        chat=openai_chat(demo_model_url, MODEL, seed=1),
        execute=execute,
        max_steps=5,
    )

    assert (outcome.finished, outcome.reason, outcome.steps, outcome.commands) == (
        False,
        "sandbox_error",
        1,
        0,
    )
    assert isinstance(outcome.exception, AgentUnavailable) and not outcome.exception.permanent
