"""The offline demo model server over real HTTP: OpenAI-compatible shapes, streaming equal to non-streaming,
seeded determinism, a scripted agent's behaviour, and stand-in labelling everywhere."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from workers.demo.model import MODEL_ID
from workers.demo.tasks import get_demo_task, load_demo_tasks
from workers.harness.builtin import FINISH_MARKER, SYSTEM_PROMPT, instruction_message, parse_reply

REPO = Path(__file__).parents[3]
FAILING = "exit code: 1\n--- stderr ---\nFAIL: test_something\nFAILED (failures=1)"
PASSING = "exit code: 0\n--- stderr ---\nRan 5 tests in 0.01s\n\nOK"


def _post(url: str, body: bytes | dict) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url + "/chat/completions", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _complete(url: str, **body) -> dict:
    status, _, raw = _post(url, {"model": MODEL_ID, **body})
    assert status == 200, raw
    return json.loads(raw)


def _stream(url: str, **body) -> list[dict | str]:
    status, headers, raw = _post(url, {"model": MODEL_ID, "stream": True, **body})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _opening(task_key: str) -> list[dict]:
    task = get_demo_task(task_key)
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction_message(task.instruction)},
    ]


def _walk(
    url: str, messages: list[dict], seed: int, turns: int, observe=lambda reply, edited: FAILING
) -> list[str]:
    """Talk to the model for `turns` turns, answering each command with observe(reply, edited so far)."""
    replies, edited = [], False
    for _ in range(turns):
        reply = _complete(url, messages=messages, seed=seed)["choices"][0]["message"]["content"]
        replies.append(reply)
        parsed = parse_reply(reply)
        if parsed.kind == "submit":
            break
        edited = edited or parsed.command.startswith("python3 - <<")
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": observe(reply, edited)},
        ]
    return replies


def test_the_models_list_names_the_stand_in(demo_model_url):
    with urllib.request.urlopen(demo_model_url + "/models", timeout=30) as response:
        listing = json.loads(response.read())
    with urllib.request.urlopen(demo_model_url + f"/models/{MODEL_ID}", timeout=30) as response:
        card = json.loads(response.read())

    assert [m["id"] for m in listing["data"]] == [MODEL_ID]
    assert "stand-in" in listing["data"][0]["description"]
    assert card["stand_in"] is True


def test_a_first_reply_is_one_shell_command_labelled_as_the_stand_in(demo_model_url):
    status, headers, raw = _post(
        demo_model_url, {"model": "whatever", "messages": _opening("slugify"), "seed": 3}
    )
    reply = json.loads(raw)

    assert status == 200 and headers["X-Trove-Stand-In"] == "demo"
    assert reply["model"] == MODEL_ID and reply["system_fingerprint"] == MODEL_ID
    content = reply["choices"][0]["message"]["content"]
    assert parse_reply(content).kind == "command"
    assert reply["choices"][0]["finish_reason"] == "stop"
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert abs(usage["completion_tokens"] - len(content) / 4) <= 1
    prompt_chars = sum(len(m["content"]) for m in _opening("slugify"))
    assert prompt_chars / 4 < usage["prompt_tokens"] < prompt_chars / 4 + 20


def test_streamed_deltas_concatenate_to_the_non_streamed_reply(demo_model_url):
    for key in ("roman_numerals", "csv_quoting", "lru_cache"):
        messages = _opening(key)
        for seed in (0, 1):
            for reply in _walk(demo_model_url, messages, seed, turns=5):
                plain = _complete(demo_model_url, messages=messages, seed=seed)
                events = _stream(
                    demo_model_url, messages=messages, seed=seed, stream_options={"include_usage": True}
                )

                chunks, done = events[:-1], events[-1]
                assert done == "[DONE]"
                deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
                assert "".join(deltas) == plain["choices"][0]["message"]["content"] == reply
                assert len(deltas) > 3
                assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
                assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
                assert all(c["system_fingerprint"] == MODEL_ID for c in chunks)
                messages = [
                    *messages,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": FAILING},
                ]


def test_a_stream_without_include_usage_has_no_usage_chunk(demo_model_url):
    events = _stream(demo_model_url, messages=_opening("pagination"), seed=1)

    assert events[-1] == "[DONE]"
    assert all(e["choices"] and "usage" not in e for e in events[:-1])


def test_the_same_conversation_and_seed_get_the_same_run_and_other_seeds_differ(demo_model_url):
    runs = {seed: _walk(demo_model_url, _opening("matrix_ops"), seed, turns=8) for seed in range(6)}
    again = {seed: _walk(demo_model_url, _opening("matrix_ops"), seed, turns=8) for seed in range(6)}

    assert runs == again
    assert len({tuple(run) for run in runs.values()}) >= 4


def test_without_a_seed_the_user_field_seeds_the_policy(demo_model_url):
    def reply(user: str) -> str:
        body = _complete(demo_model_url, messages=_opening("semver_compare"), user=user)
        return body["choices"][0]["message"]["content"]

    by_user = {f"rollout-{i}": reply(f"rollout-{i}") for i in range(8)}

    assert all(reply(user) == first for user, first in by_user.items())
    assert len(set(by_user.values())) > 1


def test_after_an_edit_and_passing_tests_the_model_submits(demo_model_url):
    def observe(reply: str, edited: bool) -> str:
        return (
            PASSING
            if edited and "unittest" in reply
            else ("edited x.py\nexit code: 0" if edited else FAILING)
        )

    submitted_after_fix = 0
    for seed in range(8):
        replies = _walk(demo_model_url, _opening("word_wrap"), seed, turns=14, observe=observe)
        commands = [parse_reply(r).command for r in replies]
        edits = [i for i, c in enumerate(commands) if c.startswith("python3 - <<")]
        if edits and parse_reply(replies[-1]).kind == "submit":
            assert any("unittest" in c for c in commands[edits[-1] + 1 :])
            assert replies[-1].rstrip().endswith(FINISH_MARKER)
            submitted_after_fix += 1
    assert submitted_after_fix >= 4


def test_an_unknown_task_is_declined_as_the_stand_in(demo_model_url):
    messages = [{"role": "user", "content": "Please migrate our billing service to Rust."}]

    replies = _walk(demo_model_url, messages, seed=1, turns=3)

    assert parse_reply(replies[0]).command == "ls -la"
    assert parse_reply(replies[1]).kind == "submit" and "stand-in" in replies[1]


def test_a_mini_swe_style_prompt_gets_its_echo_submit(demo_model_url):
    messages = [
        {"role": "system", "content": "When done, run: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
        {"role": "user", "content": "Please migrate our billing service to Rust."},
    ]

    replies = _walk(demo_model_url, messages, seed=1, turns=2)

    assert parse_reply(replies[1]).command == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_max_tokens_cuts_the_reply_with_finish_reason_length(demo_model_url):
    full = _complete(demo_model_url, messages=_opening("calc_expr"), seed=2)
    cut = _complete(demo_model_url, messages=_opening("calc_expr"), seed=2, max_tokens=5)

    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"][:20]


def test_bad_requests_get_a_400_naming_the_field(demo_model_url):
    cases = [
        (b"{not json", None),
        ({"model": MODEL_ID}, "messages"),
        ({"model": MODEL_ID, "messages": [{"content": "hi"}]}, "messages[0]"),
        ({"model": MODEL_ID, "messages": _opening("slugify"), "n": 2}, "n"),
        ({"model": MODEL_ID, "messages": _opening("slugify"), "seed": "7"}, "seed"),
        ({"model": MODEL_ID, "messages": _opening("slugify"), "max_tokens": 0}, "max_tokens"),
    ]
    for body, param in cases:
        status, _, raw = _post(demo_model_url, body)
        error = json.loads(raw)["error"]
        assert status == 400 and error["type"] == "invalid_request_error"
        assert error["param"] == param


def test_every_demo_task_is_recognised_from_the_harness_prompt(demo_model_url):
    for task in load_demo_tasks():
        replies = _walk(demo_model_url, _opening(task.key), seed=0, turns=2)
        assert "stand-in" not in replies[-1], task.key


def test_it_runs_standalone_as_a_module():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.demo.model", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        listing = None
        deadline = time.monotonic() + 30
        while listing is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                    listing = json.loads(response.read())
            except OSError:
                time.sleep(0.2)
        assert listing is not None and listing["data"][0]["id"] == MODEL_ID
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    assert "stand-in" in output
