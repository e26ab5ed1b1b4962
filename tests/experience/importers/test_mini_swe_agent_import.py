"""mini-swe-agent trajectories, in both formats (samples written after save_traj / Agent.save)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from experience.importers import iter_records
from importers.fixture_files import MINI_V1, MINI_V2, raw_json


def test_format_1_run_pairs_each_bash_block_with_its_returncode_and_output() -> None:
    [record] = iter_records(MINI_V1)
    assert [s.kind for s in record.steps] == [
        "message",
        "message",
        "model_call",
        "command",
        "model_call",
        "observation",  # two bash blocks: a format error, nothing ran
        "model_call",
        "command",
        "model_call",
        "command",
        "model_call",
        "command",
        "observation",  # the submission, sent back as the final user message
    ]
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.exit_code for c in commands] == [0, 1, 0, None]
    assert commands[0].command == 'grep -rn "def divide" src/'
    assert commands[0].output == "src/calc.py:12:def divide(a, b):"
    assert commands[1].output.endswith("ZeroDivisionError: division by zero")
    assert (
        record.steps[5].text
        == "Please always provide EXACTLY ONE action in triple backticks, found 2 actions."
    )


def test_format_1_model_calls_keep_usage_ids_and_context() -> None:
    [record] = iter_records(MINI_V1)
    raw = raw_json(MINI_V1)
    assistants = [m for m in raw["messages"] if m["role"] == "assistant"]
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [c.tokens_in for c in calls] == [
        m["extra"]["response"]["usage"]["prompt_tokens"] for m in assistants
    ]
    assert [c.tokens_in for c in calls] == [1480, 1563, 1671, 1822, 1911]
    assert [c.tokens_out for c in calls] == [41, 72, 49, 88, 37]
    assert [c.call_id for c in calls] == [
        "chatcmpl-0a1",
        "chatcmpl-0a2",
        "chatcmpl-0a3",
        "chatcmpl-0a4",
        "chatcmpl-0a5",
    ]
    assert [len(c.request_messages) for c in calls] == [2, 4, 6, 8, 10]
    assert calls[0].model == "claude-sonnet-4-20250514"


def test_format_1_run_fields() -> None:
    [record] = iter_records(MINI_V1)
    assert record.source_format == "mini-swe-agent-traj" and record.source_version == "mini-swe-agent-1"
    assert record.task_key == "example__calc-17"
    assert record.model == "anthropic/claude-sonnet-4-20250514"
    assert record.cost == 0.0317
    assert record.final_diff.startswith("diff --git a/src/calc.py b/src/calc.py")
    assert record.metadata["exit_status"] == "Submitted" and record.metadata["agent_version"] == "1.9.1"
    assert record.metadata["usage"] == {"tokens_in": 8447, "tokens_out": 287, "api_calls": 5}


def test_format_1_1_run_matches_tool_answers_to_their_calls() -> None:
    [record] = iter_records(MINI_V2)
    assert [s.kind for s in record.steps] == [
        "message",
        "message",
        "model_call",
        "command",
        "command",
        "model_call",
        "observation",
        "model_call",
        "command",
        "model_call",
        "command",
        "model_call",
        "command",
        "note",
    ]
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.payload["tool_call_id"] for c in commands] == [
        "call_a1",
        "call_a2",
        "call_b1",
        "call_c1",
        "call_d1",
    ]
    assert [c.exit_code for c in commands] == [0, 0, 1, 0, None]
    assert commands[0].output == "9:    regex = r'^[\\w.@+-]+$'\n19:    regex = r'^[\\w.@+-]+$'\n"
    format_error = record.steps[6]
    assert format_error.is_error and format_error.payload["interrupt_type"] == "FormatError"
    assert record.steps[-1].payload["exit_status"] == "Submitted"


def test_format_1_1_keeps_timestamps_and_durations() -> None:
    [record] = iter_records(MINI_V2)
    start = 1752060000.25
    first_call, first_command = record.steps[2], record.steps[3]
    assert first_call.ended_at == datetime.fromtimestamp(start + 3.5, tz=UTC)
    assert first_command.started_at == first_call.ended_at
    assert first_command.ended_at == datetime.fromtimestamp(start + 4.0, tz=UTC)
    test_run = record.steps[8]
    assert (test_run.ended_at - test_run.started_at).total_seconds() == 7.5
    assert record.started_at == datetime.fromtimestamp(start + 3.5, tz=UTC)
    assert record.finished_at == datetime.fromtimestamp(start + 33.9, tz=UTC)


def test_format_1_1_run_fields() -> None:
    [record] = iter_records(MINI_V2)
    assert record.source_version == "mini-swe-agent-1.1"
    assert record.task_key == "django__django-11099"  # from the file name: no instance_id in the file
    assert record.model == "openai/gpt-5-mini" and record.cost == 0.0057
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [c.payload["cost"] for c in calls] == [0.0011, 0.0006, 0.0019, 0.0012, 0.0009]
    assert sum(c.tokens_in for c in calls) == 2210 + 2490 + 2561 + 2790 + 2901
    assert calls[0].tool_calls[1]["function"]["name"] == "bash"
    assert record.final_diff.startswith("diff --git a/django/contrib/auth/validators.py")


def test_a_timed_out_command_keeps_its_timeout_message_and_is_an_error_without_exit_code(tmp_path) -> None:
    raw = json.loads(MINI_V1.read_bytes())
    timeout = ("The last command <command>grep -rn \"def divide\" src/</command> timed out and has been killed.\n"
               "The output of the command was:\n <output>\nsrc/calc.py:12:def divide(a, b):\n</output>\n"
               "Please try another command and make sure to avoid those requiring interactive input.")
    raw["messages"][3]["content"] = timeout
    path = tmp_path / "timeout.traj.json"
    path.write_text(json.dumps(raw))
    [record] = list(iter_records(path))
    first = next(s for s in record.steps if s.kind == "command")
    assert (first.command, first.exit_code, first.is_error) == ('grep -rn "def divide" src/', None, True)
    assert first.output == "src/calc.py:12:def divide(a, b):" and first.payload["timeout_message"] == timeout
    assert not any(s.kind == "observation" and s.text == timeout for s in record.steps)


def _first_model_call(raw: dict, tmp_path, name: str):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    [record] = list(iter_records(path))
    return next(s for s in record.steps if s.kind == "model_call")


def test_format_1_reads_the_thought_a_provider_returns_beside_the_content_from_the_saved_response(tmp_path) -> None:
    # Format 1 saves the assistant message as {content, extra: {response}}: Gemini's reasoning_content (through
    # LiteLLM) lives only in the saved response's message.
    raw = raw_json(MINI_V1)
    message = next(m for m in raw["messages"] if m["role"] == "assistant")
    message["extra"]["response"]["choices"][0]["message"]["reasoning_content"] = "divide is in src/calc.py, likely"
    assert _first_model_call(raw, tmp_path, "gemini.traj.json").text == "divide is in src/calc.py, likely"


def test_format_1_1_reads_the_thought_a_provider_returns_beside_the_content_on_the_message(tmp_path) -> None:
    raw = raw_json(MINI_V2)
    message = next(m for m in raw["messages"] if m["role"] == "assistant")
    message["reasoning_content"] = "look at the validators first"
    assert _first_model_call(raw, tmp_path, "gemini.traj.json").text == "look at the validators first"
