"""OpenAI-format conversations in one JSON document: tau-bench's published trajectories (a real file), arrays
and wrapping objects built to the same shape, and what a valid JSON file of another shape is told."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experience.importers import (
    ImportFormatError,
    ImportValidationError,
    detect_format,
    read_all,
)
from importers.fixture_files import CONVERSATIONS, TAU_BENCH, raw_json, raw_jsonl


def test_a_tau_bench_file_is_one_run_per_element_with_task_trial_reward_and_info() -> None:
    [record] = read_all(TAU_BENCH)
    [raw] = raw_json(TAU_BENCH)
    assert detect_format(TAU_BENCH) == "openai_conversations"
    assert (record.task_key, record.metadata["sample"], record.reward) == ("0", 0, 0.0)
    assert record.source_ref == "openai-conversations:tau-bench/gpt-4o-airline.json#task-0-trial-0"
    assert record.metadata["info"] == raw["info"] and record.harness == "tau-bench"
    assert record.instruction == raw["traj"][1]["content"]


def test_a_0_1_reward_without_a_verdict_sets_success_marked_as_derived() -> None:
    [record] = read_all(TAU_BENCH)
    assert record.success is False
    assert record.metadata["outcome_derived"] == {"success": "reward >= 1 (a 0/1 reward)"}


def test_messages_tool_calls_and_results_match_the_source_byte_for_byte() -> None:
    [record] = read_all(TAU_BENCH)
    traj = raw_json(TAU_BENCH)[0]["traj"]
    calls = [s for s in record.steps if s.kind == "model_call"]
    assistant = [m for m in traj if m["role"] == "assistant"]
    assert [c.response_text for c in calls] == [m["content"] or "" for m in assistant]
    assert [c.tool_calls for c in calls] == [m.get("tool_calls") and [
        {"id": t["id"], "type": "function", "function": t["function"]} for t in m["tool_calls"]] for m in assistant]
    results = [m for m in traj if m["role"] == "tool"]
    observations = [s for s in record.steps if s.kind == "observation"]
    assert [(o.text, o.payload["tool_call_id"]) for o in observations] == [
        (m["content"], m["tool_call_id"]) for m in results]
    last = calls[-1].request_messages
    assert [m.content for m in last] == [m["content"] or "" for m in traj[: len(last)]]
    assert [s.text for s in record.steps if s.kind == "message"] == [
        m["content"] for m in traj if m["role"] in ("system", "user")]


def test_a_pretty_printed_array_reads_as_the_jsonl_does(tmp_path: Path) -> None:
    array = tmp_path / "runs.json"
    array.write_text(json.dumps(raw_jsonl(CONVERSATIONS), indent=2))
    from_array, from_jsonl = read_all(array), read_all(CONVERSATIONS)
    assert detect_format(array) == "openai_conversations"
    assert [r.task_key for r in from_array] == [r.task_key for r in from_jsonl]
    assert [[(s.kind, s.text, s.command, s.output) for s in r.steps] for r in from_array] == [
        [(s.kind, s.text, s.command, s.output) for s in r.steps] for r in from_jsonl]
    assert [r.source_ref for r in from_array][:1] == ["openai-conversations:" + array.parent.name + "/runs.json#run-0001"]


def test_an_object_wrapping_conversations_keeps_its_other_keys(tmp_path: Path) -> None:
    wrapped = tmp_path / "export.json"
    rows = raw_jsonl(CONVERSATIONS)
    wrapped.write_text(json.dumps({"version": 3, "conversations": rows}, indent=1))
    records = read_all(wrapped)
    assert len(records) == len(rows) and records[0].metadata["collection"] == {"version": 3}


def test_one_bare_list_of_messages_is_one_run(tmp_path: Path) -> None:
    bare = tmp_path / "chat.json"
    messages = raw_jsonl(CONVERSATIONS)[0]["messages"]
    bare.write_text(json.dumps(messages, indent=2))
    [record] = read_all(bare)
    assert detect_format(bare) == "openai_conversations"
    assert record.instruction == messages[1]["content"] and record.source_ref.endswith("#record-0")


def test_a_threshold_from_the_command_line_decides_a_fractional_reward(tmp_path: Path) -> None:
    rows = [{"task_id": "t", "trial": n, "score": score, "messages": [{"role": "user", "content": "hi"}]}
            for n, score in enumerate((0.5, 0.8))]
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(rows, indent=2))
    assert [r.success for r in read_all(path)] == [None, None]
    judged = read_all(path, success_threshold=0.75)
    assert [(r.reward, r.success) for r in judged] == [(0.5, False), (0.8, True)]
    assert judged[0].metadata["outcome_derived"] == {"success": "reward >= 0.75 (--success-threshold)"}


def test_a_stated_verdict_is_kept_and_not_marked_derived(tmp_path: Path) -> None:
    path = tmp_path / "resolved.json"
    path.write_text(json.dumps([{"task_id": "t", "reward": 1, "resolved": "False",
                                 "messages": [{"role": "user", "content": "x"}]}], indent=2))
    [record] = read_all(path)
    assert (record.reward, record.success) == (1.0, False) and "outcome_derived" not in record.metadata


def test_a_conversation_without_messages_is_named(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{"task_id": 1, "traj": [{"role": "user", "content": "x"}]}, {"task_id": 2}], indent=2))
    with pytest.raises(ImportValidationError, match=r"runs.json record 1: field 'messages' missing"):
        read_all(path)


def test_a_valid_json_file_of_unknown_shape_says_so_not_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([{"name": "a", "value": 1}], indent=2))
    with pytest.raises(ImportFormatError) as caught:
        detect_format(path)
    assert "valid JSON of an unknown shape" in str(caught.value) and "corrupted" not in str(caught.value)


@pytest.mark.parametrize("field", [
    {"reasoning_content": "think first"},  # Gemini through LiteLLM, DeepSeek
    {"reasoning": "think first"},  # OpenRouter
    {"thinking_blocks": [{"type": "thinking", "thinking": "think first", "signature": "x"}]},  # LiteLLM
])
def test_reasoning_returned_beside_the_content_is_the_model_calls_thought(tmp_path: Path, field: dict) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([{"task_id": "t", "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", **field}]}], indent=2))
    [record] = read_all(path)
    call = next(s for s in record.steps if s.kind == "model_call")
    assert (call.text, call.response_text) == ("think first", "a")


def test_the_array_forced_as_the_jsonl_format_still_reads(tmp_path: Path) -> None:
    """What used to answer "invalid JSON at column 1 (corrupted?)"."""
    array = tmp_path / "runs.json"
    array.write_text(json.dumps(raw_jsonl(CONVERSATIONS), indent=2))
    assert [r.task_key for r in read_all(array, "openai_messages")] == [r.task_key for r in read_all(CONVERSATIONS)]


def test_a_one_line_wrapping_object_is_a_document_and_a_jsonl_with_a_deep_line_is_still_jsonl(tmp_path: Path) -> None:
    rows = raw_jsonl(CONVERSATIONS)
    one_line = tmp_path / "export.json"
    one_line.write_text(json.dumps({"conversations": rows}))
    assert detect_format(one_line) == "openai_conversations" and len(read_all(one_line)) == len(rows)
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text(json.dumps(rows[0]) + "\n" + "[" * 5 + "]" * 5 + "\n")
    assert detect_format(jsonl) == "openai_messages"
