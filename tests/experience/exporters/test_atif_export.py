"""ATIF export: valid per the ATIF v1.7 schema, streamed, and read back to the same steps."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from importers.fixture_files import ALL_FILES, BROWSER, HARBOR_BUILT, MULTI_SWE, PYDICOM, label

from experience.exporters import atif
from experience.importers import detect_format, read_all
from experience.importers.base import tool_call_parts
from experience.records import StepRecord, TrajectoryRecord

ROOT_KEYS = {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics", "extra",
             "continued_trajectory_ref", "subagent_trajectories"}
AGENT_KEYS = {"name", "version", "model_name", "extra"}
STEP_KEYS = {
    "step_id",
    "timestamp",
    "source",
    "model_name",
    "reasoning_effort",
    "message",
    "reasoning_content",
    "tool_calls",
    "observation",
    "metrics",
    "llm_call_count",
    "is_copied_context",
    "extra",
}
AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}
METRIC_KEYS = {
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
    "prompt_token_ids",
    "completion_token_ids",
    "logprobs",
    "extra",
}
FINAL_KEYS = {
    "total_prompt_tokens",
    "total_completion_tokens",
    "total_cached_tokens",
    "total_cost_usd",
    "total_steps",
    "extra",
}


def schema_problems(doc: dict[str, Any]) -> list[str]:
    """Checks from the ATIF RFC (harbor rfcs/0001-trajectory-format.md, v1.7)."""
    problems = []
    problems += [f"root: unknown {k}" for k in set(doc) - ROOT_KEYS]
    problems += [f"root: missing {k}" for k in ("schema_version", "agent", "steps") if k not in doc]
    if not (doc.get("session_id") or doc.get("trajectory_id")):
        problems.append("root: neither session_id nor trajectory_id")
    if not re.fullmatch(r"ATIF-v1\.\d+", str(doc.get("schema_version"))):
        problems.append("schema_version")
    agent = doc.get("agent", {})
    problems += [f"agent: unknown {k}" for k in set(agent) - AGENT_KEYS]
    problems += [f"agent.{k}" for k in ("name", "version") if not isinstance(agent.get(k), str)]
    for index, step in enumerate(doc.get("steps", [])):
        problems += [f"steps[{index}]: {p}" for p in step_problems(step, index + 1)]
    final = doc.get("final_metrics", {})
    problems += [f"final_metrics: unknown {k}" for k in set(final) - FINAL_KEYS]
    problems += [
        f"final_metrics.{k}" for k, v in final.items() if k != "extra" and not isinstance(v, int | float)
    ]
    return problems


def step_problems(step: dict[str, Any], expected_id: int) -> list[str]:
    problems = [f"unknown {k}" for k in set(step) - STEP_KEYS]
    if step.get("step_id") != expected_id:
        problems.append("step_id not sequential from 1")
    if step.get("source") not in ("system", "user", "agent"):
        problems.append("source")
    if not isinstance(step.get("message"), str):
        problems.append("message")
    if "timestamp" in step:
        datetime.fromisoformat(step["timestamp"])
    if step.get("source") != "agent":
        problems += [f"{k} on a non-agent step" for k in AGENT_ONLY & set(step)]
    if "llm_call_count" in step and not (isinstance(step["llm_call_count"], int) and step["llm_call_count"] >= 0):
        problems.append("llm_call_count")
    if step.get("llm_call_count") == 0 and {"metrics", "reasoning_content"} & set(step):
        problems.append("metrics or reasoning_content with llm_call_count 0")
    if step.get("source") == "user" and "observation" in step:
        problems.append("observation on a user step")
    call_ids = []
    for call in step.get("tool_calls", []):
        if not {"tool_call_id", "function_name", "arguments"} <= set(call) <= {
            "tool_call_id", "function_name", "arguments", "extra"} or not isinstance(
            call["arguments"], dict
        ):
            problems.append(f"tool call {call}")
        call_ids.append(call.get("tool_call_id"))
    if len(call_ids) != len(set(call_ids)):
        problems.append("repeated tool_call_id")
    for result in step.get("observation", {}).get("results", []):
        if set(result) - {"source_call_id", "content", "subagent_trajectory_ref", "extra"} or not isinstance(
            result.get("content"), str
        ):
            problems.append(f"result {result}")
        if "source_call_id" in result and result["source_call_id"] not in call_ids:
            problems.append("source_call_id names no tool call of the step")
    metrics = step.get("metrics", {})
    problems += [f"metrics: unknown {k}" for k in set(metrics) - METRIC_KEYS]
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        if key in metrics and not (isinstance(metrics[key], int) and metrics[key] >= 0):
            problems.append(f"metrics.{key}")
    for key in ("prompt_token_ids", "completion_token_ids"):
        if key in metrics and not all(isinstance(v, int) and not isinstance(v, bool) for v in metrics[key]):
            problems.append(f"metrics.{key}")
    if "logprobs" in metrics and not all(isinstance(v, int | float) for v in metrics["logprobs"]):
        problems.append("metrics.logprobs")
    return problems


def carried(step: StepRecord) -> tuple:
    """What ATIF can carry of a step: its kind and main texts."""
    if step.kind == "message":
        return step.kind, step.text
    if step.kind == "model_call":
        return step.kind, step.response_text or "", step.text
    if step.kind == "command":
        return step.kind, step.command, step.output, step.exit_code
    if step.kind == "tool_call":
        return step.kind, [atif_arguments(*tool_call_parts(c)[1:]) for c in step.tool_calls or []]
    return step.kind, step.text


def atif_arguments(name: str, arguments):
    """ATIF's arguments are an object: a freeform text argument (Codex's apply_patch) travels as {"input": text}."""
    if isinstance(arguments, str) and arguments:
        return name, {"input": arguments}
    return name, arguments


def export_file(record: TrajectoryRecord, path: Path) -> Path:
    with open(path, "w") as handle:
        atif.dump(record, handle)
    return path


@pytest.mark.parametrize("source", ALL_FILES, ids=label)
def test_exports_are_valid_atif_and_stream_the_same_document(source: Path, tmp_path: Path) -> None:
    for index, record in enumerate(read_all(source)):
        document = atif.write(record)
        assert schema_problems(document) == []
        streamed = json.loads(export_file(record, tmp_path / f"{index}.json").read_text())
        assert streamed == json.loads(json.dumps(document))


@pytest.mark.parametrize("source", ALL_FILES, ids=label)
def test_an_exported_run_reads_back_to_the_same_steps(source: Path, tmp_path: Path) -> None:
    for index, record in enumerate(read_all(source)):
        path = export_file(record, tmp_path / f"{index}.json")
        assert detect_format(path) == "atif"
        [back] = read_all(path)
        assert [carried(s) for s in back.steps] == [carried(s) for s in record.steps]
        assert (back.source_ref, back.task_key, back.reward, back.success, back.final_diff) == (
            record.source_ref,
            record.task_key,
            record.reward,
            record.success,
            record.final_diff,
        )
        calls = [s for s in record.steps if s.kind == "model_call"]
        assert [(s.tokens_in, s.tokens_out) for s in back.steps if s.kind == "model_call"] == [
            (s.tokens_in, s.tokens_out) for s in calls
        ]


def test_a_swe_agent_run_becomes_three_opening_steps_and_twelve_agent_turns() -> None:
    [record] = read_all(PYDICOM)
    document = atif.write(record)
    steps = document["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "user"] + ["agent"] * 12
    first = steps[3]
    assert first["message"] == record.steps[3].response_text
    assert first["reasoning_content"] == record.steps[3].text
    assert first["tool_calls"] == [
        {
            "tool_call_id": "call_4",
            "function_name": "bash",
            "arguments": {"command": "create reproduce_bug.py\n"},
        }
    ]
    assert first["observation"]["results"] == [
        {"source_call_id": "call_4", "content": record.steps[4].output}
    ]
    assert document["final_metrics"] == {"total_steps": 15, "total_cost_usd": 1.26719}
    assert document["session_id"] == record.source_ref
    assert document["agent"] == {"name": "swe-agent", "version": "unknown"}


def test_tokens_cost_and_kinds_without_an_atif_field_survive() -> None:
    [record] = read_all(BROWSER)
    document = atif.write(record)
    assert document["final_metrics"]["total_prompt_tokens"] == 15235
    assert document["final_metrics"]["total_completion_tokens"] == 281
    agent_steps = [s for s in document["steps"] if s["source"] == "agent"]
    assert [s["metrics"]["prompt_tokens"] for s in agent_steps] == [1124, 1568, 2732, 3896, 5915]
    assert agent_steps[0]["extra"]["trove"]["kinds"] == [
        "model_call",
        "tool_call",
        "sandbox_event",
        "sandbox_event",
        "sandbox_event",
        "sandbox_event",
        "observation",
    ]
    assert document["extra"]["trove"]["reward"] == 1.0


def test_exit_codes_ride_in_the_step_extra() -> None:
    record = read_all(MULTI_SWE)[1]
    document = atif.write(record)
    codes = [code for s in document["steps"] for code in s["extra"]["trove"].get("exit_codes", {}).values()]
    assert codes == [s.exit_code for s in record.steps if s.kind == "command"]


def test_many_runs_export_as_atif_jsonl_and_read_back(tmp_path: Path) -> None:
    records = read_all(MULTI_SWE)
    path = tmp_path / "runs.jsonl"
    with open(path, "wb") as handle:
        assert atif.dump_lines(records, handle) == 3
    assert detect_format(path) == "atif"
    back = read_all(path)
    assert [r.task_key for r in back] == [r.task_key for r in records]


def test_dump_writes_text_and_binary_alike() -> None:
    [record] = read_all(PYDICOM)
    text, binary = io.StringIO(), io.BytesIO()
    atif.dump(record, text)
    atif.dump(record, binary)
    assert binary.getvalue() == text.getvalue().encode()


RL_KEYS = ("prompt_token_ids", "token_ids", "logprobs", "llm_call_count", "subagent_source_ref", "is_error")


def test_v1_7_fields_export_and_read_back_the_same(tmp_path: Path) -> None:
    run, *_ = read_all(HARBOR_BUILT / "result.json")
    document = atif.write(run)
    assert document["schema_version"] == "ATIF-v1.7" and document["trajectory_id"] == run.source_ref
    agent = [s for s in document["steps"] if s["source"] == "agent"]
    # the dispatched action (no model call of its own) folds into the turn before it
    assert [s.get("llm_call_count") for s in agent] == [1, 2, 1]
    assert agent[0]["metrics"]["completion_token_ids"] == [2082, 25, 1598, 2889]
    assert agent[0]["metrics"]["logprobs"] == [-0.0123, -1.5, -0.25, 0.0]
    links = [r["extra"]["trove"]["subagent_source_ref"] for s in agent for r in s.get("observation", {}).get("results", [])
             if "trove" in r.get("extra", {})]
    assert links == run.metadata["subagent_source_refs"]
    [back] = read_all(export_file(run, tmp_path / "run.json"))
    assert [carried(s) for s in back.steps] == [carried(s) for s in run.steps]
    assert [{k: s.payload.get(k) for k in RL_KEYS} for s in back.steps] == [
        {k: s.payload.get(k) for k in RL_KEYS} for s in run.steps]


def test_logprobs_recorded_by_the_proxy_export_as_numbers() -> None:
    step = StepRecord(kind="model_call", response_text="hi", payload={
        "prompt_token_ids": [1, 2], "token_ids": [7, 8],
        "logprobs": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:8", "logprob": -0.25}]})
    record = TrajectoryRecord(source="rollout", source_format="trove", source_ref="r1", task_key="t", steps=[step])
    metrics = atif.write(record)["steps"][0]["metrics"]
    assert metrics == {"prompt_token_ids": [1, 2], "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}
    step.payload["logprobs"] = [{"token": "a"}, {"token": "b", "logprob": -1.0}]
    assert "logprobs" not in atif.write(record)["steps"][0]["metrics"], "a gap would shift every logprob"


def test_actions_no_model_call_opened_are_a_dispatch_with_llm_call_count_0() -> None:
    steps = [StepRecord(kind="message", text="go", payload={"role": "user"}),
             StepRecord(kind="command", command="make", output="done", exit_code=0)]
    record = TrajectoryRecord(source="rollout", source_format="trove", source_ref="r2", task_key="t", steps=steps)
    dispatch = atif.write(record)["steps"][1]
    assert (dispatch["source"], dispatch["llm_call_count"]) == ("agent", 0)
    assert "metrics" not in dispatch and "reasoning_content" not in dispatch
    assert schema_problems(atif.write(record)) == []
