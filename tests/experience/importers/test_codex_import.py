"""Codex CLI rollouts: a real one (session_meta, context turns, turn contexts) and one built to codex-rs'
RolloutLine schema with shell calls in both argument shapes, parallel calls, apply_patch, token counts and an
interrupted end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experience.importers import ImportFormatError, detect_format, read_all
from importers.fixture_files import CODEX_CCL, CODEX_REAL, CODEX_TOOLS, raw_jsonl


def _items(path: Path, kind: str) -> list[dict]:
    return [ln["payload"] for ln in raw_jsonl(path) if ln["type"] == "response_item" and ln["payload"]["type"] == kind]


def test_the_real_rollout_is_one_run_with_its_session_metadata() -> None:
    [record] = read_all(CODEX_REAL)
    meta = raw_jsonl(CODEX_REAL)[0]["payload"]
    assert detect_format(CODEX_REAL) == "codex"
    assert (record.source_ref, record.source_version, record.model, record.harness) == (
        "codex:019b64e5-57fa-7463-b644-fba7e456f905", "0.77.0", "gpt-5.2-codex", "codex")
    assert record.metadata["cwd"] == meta["cwd"] and record.metadata["instructions"] == meta["instructions"]
    assert record.metadata["turn_context"]["sandbox_policy"]["type"] == "workspace-write"


def test_context_turns_are_marked_and_the_typed_prompt_is_the_instruction() -> None:
    [record] = read_all(CODEX_REAL)
    texts = [m["content"][0]["text"] for m in _items(CODEX_REAL, "message")]
    assert [s.text for s in record.steps] == texts  # byte for byte
    assert [s.payload.get("context", False) for s in record.steps] == [True, True, False]
    assert record.instruction == texts[2]


def test_calls_are_commands_with_outputs_exit_codes_and_durations() -> None:
    [record] = read_all(CODEX_TOOLS)
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.command for c in commands] == ["cat calc.py", "pytest -q 'tests/test calc.py'", "pytest -q", "flake8"]
    outputs = {o["call_id"]: o["output"] for o in _items(CODEX_TOOLS, "function_call_output")}
    assert commands[0].output == json.loads(outputs["call_A1"])["output"]
    assert commands[2].output == outputs["call_C1"]  # newer versions' text output, kept whole
    assert [(c.exit_code, c.is_error, c.duration_ms) for c in commands[:3]] == [
        (0, False, 20.0), (1, True, 1200.0), (0, False, None)]
    assert commands[3].output is None and commands[3].payload["unanswered"] is True


def test_parallel_calls_join_one_model_call_with_reasoning_and_tokens() -> None:
    [record] = read_all(CODEX_TOOLS)
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert calls[0].text == "**Inspecting calc.py and the tests**"
    assert [c["id"] for c in calls[0].tool_calls] == ["call_A1", "call_A2"]
    assert calls[0].tool_calls[0]["function"]["arguments"] == _items(CODEX_TOOLS, "function_call")[0]["arguments"]
    assert [(c.tokens_in, c.tokens_out) for c in calls] == [(5120, 180), (5600, 95), (5900, 40), (6100, 30),
                                                             (None, None)]
    assert calls[3].response_text == 'divide now raises ValueError("division by zero"); both tests pass.'
    assert record.metadata["usage"] == {"tokens_in": 22720, "tokens_out": 345, "cached_tokens_in": 2048}
    assert [m.role for m in calls[1].request_messages] == ["user", "user", "assistant", "tool", "tool"]


def test_apply_patch_is_a_tool_call_with_its_patch_and_result() -> None:
    [record] = read_all(CODEX_TOOLS)
    patch = _items(CODEX_TOOLS, "custom_tool_call")[0]
    call = next(s for s in record.steps if s.kind == "tool_call")
    assert call.tool_calls[0]["function"] == {"name": "apply_patch", "arguments": patch["input"]}
    result = record.steps[record.steps.index(call) + 1]
    assert (result.kind, result.text) == ("observation", "Success. Updated the following files:\nM calc.py\n")


def test_an_aborted_turn_is_an_error_note() -> None:
    [record] = read_all(CODEX_TOOLS)
    assert (record.steps[-1].kind, record.steps[-1].text, record.steps[-1].is_error) == (
        "note", "turn aborted: interrupted", True)


def test_a_pre_envelope_rollout_is_read(tmp_path: Path) -> None:
    old = tmp_path / "rollout-2025-05-01-abc.jsonl"
    lines = [{"id": "abc", "timestamp": "2025-05-01T10:00:00Z", "instructions": None},
             {"record_type": "state"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls please"}]},
             {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "c1"},
             {"type": "function_call_output", "call_id": "c1", "output": "{\"output\":\"a.txt\\n\",\"metadata\":"
                                                                     "{\"exit_code\":0,\"duration_seconds\":0.1}}"}]
    old.write_text("".join(json.dumps(line) + "\n" for line in lines))
    [record] = read_all(old)
    assert detect_format(old) == "codex" and record.source_ref == "codex:abc"
    assert [(s.kind, s.command, s.output) for s in record.steps] == [
        ("message", None, None), ("model_call", None, None), ("command", "ls", "a.txt\n")]


def test_a_cut_rollout_line_is_named(tmp_path: Path) -> None:
    cut = tmp_path / "rollout-cut.jsonl"
    cut.write_bytes(CODEX_TOOLS.read_bytes()[:-40])
    with pytest.raises(ImportFormatError, match=r"rollout-cut.jsonl line 24: invalid JSON"):
        read_all(cut)


def test_another_projects_rollout_fixture_reads_and_encrypted_reasoning_is_not_kept() -> None:
    """daaain/claude-code-log's rollout: exec_command, apply_patch with list output, an MCP call, a record
    type from a later version (ignored)."""
    [record] = read_all(CODEX_CCL)
    outputs = [p["output"] for p in _items(CODEX_CCL, "function_call_output")]
    assert [(s.kind, s.command or s.text or s.response_text or "") for s in record.steps] == [
        ("message", "List the synthetic files."), ("model_call", "I will inspect the synthetic directory."),
        ("command", "find . -maxdepth 1 -type f"), ("model_call", ""), ("tool_call", ""), ("observation", "Done!"),
        ("model_call", ""), ("tool_call", ""), ("observation", outputs[1]),
        ("model_call", "The synthetic files are alpha.txt and beta.txt.")]
    assert record.steps[2].output == outputs[0]
    assert "SYNTHETIC_ENCRYPTED" not in repr(record)
