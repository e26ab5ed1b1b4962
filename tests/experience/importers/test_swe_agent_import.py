"""SWE-agent .traj files: numbers read off the files, and recomputed from the raw JSON per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from experience.importers import iter_records
from importers.fixture_files import DEMOS, PYDICOM, SWE_AGENT_FILES, TEST_REPO_FC, label, raw_json


def kinds(record) -> list[str]:
    return [s.kind for s in record.steps]


def test_pydicom_run_has_twelve_model_calls_each_followed_by_its_command() -> None:
    [record] = iter_records(PYDICOM)
    assert kinds(record) == ["message"] * 3 + ["model_call", "command"] * 12
    assert [s.payload["role"] for s in record.steps[:3]] == ["system", "user", "user"]
    assert record.steps[1].payload["is_demo"] is True
    assert record.steps[4].command == "create reproduce_bug.py\n"
    assert record.steps[4].output == "[File: /pydicom__pydicom/reproduce_bug.py (1 lines total)]\n1:\n"


def test_pydicom_run_keeps_cost_tokens_and_the_submitted_patch() -> None:
    [record] = iter_records(PYDICOM)
    assert record.source_format == "swe-agent-traj" and record.harness == "swe-agent"
    assert record.task_key == "pydicom__pydicom-1458"
    assert record.cost == 1.26719
    assert record.metadata["usage"] == {"tokens_in": 122612, "tokens_out": 1369, "api_calls": 12}
    assert record.metadata["exit_status"] == "submitted"
    assert record.final_diff.startswith("\ndiff --git a/pydicom/pixel_data_handlers/numpy_handler.py")
    assert record.reward is None and record.success is None  # SWE-agent does not judge its own runs


def test_each_model_call_sees_the_history_up_to_its_own_reply() -> None:
    [record] = iter_records(PYDICOM)
    history = raw_json(PYDICOM)["history"]
    calls = [s for s in record.steps if s.kind == "model_call"]
    first, second = calls[0], calls[1]
    assert [m.role for m in first.request_messages] == ["system", "user", "user"]
    assert first.request_messages[2].content == history[2]["content"]
    assert len(second.request_messages) == 5  # + the first reply and its observation
    assert first.response_text == raw_json(PYDICOM)["trajectory"][0]["response"]
    assert first.text == raw_json(PYDICOM)["trajectory"][0]["thought"]


def test_function_calling_run_keeps_execution_time_tool_calls_and_the_task_id() -> None:
    [record] = iter_records(TEST_REPO_FC)
    raw = raw_json(TEST_REPO_FC)
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.duration_ms for c in commands] == [e["execution_time"] * 1000 for e in raw["trajectory"]]
    assert commands[0].duration_ms == pytest.approx(281.4128, abs=1e-3)
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert calls[0].tool_calls[0]["function"] == {
        "name": "find_file",
        "arguments": '{"file_name":"missing_colon.py"}',
    }
    assert calls[0].tool_calls[0]["id"] == "call_fJuazlMUN5fQDQ73G6XSpYpx"
    assert (
        calls[-1].tool_calls is None and calls[-1].request_messages is None
    )  # "submit" is not in the history
    assert record.task_key == "SWE-agent__test-repo-i1" and record.model == "gpt-4o"
    assert record.cost == pytest.approx(0.01952)
    assert record.metadata["usage"] == {"tokens_in": 7141, "tokens_out": 243, "api_calls": 5}


def test_a_requeried_step_missing_from_the_history_has_no_context() -> None:
    path = DEMOS / "ctf" / "crypto" / "BabyEncryption.traj"
    [record] = iter_records(path)
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert len(calls) == 16
    missing = [i for i, c in enumerate(calls) if c.request_messages is None]
    assert missing == [8]
    assert record.steps[2 + 2 * 8 + 1].command == raw_json(path)["trajectory"][8]["action"]


def test_a_history_only_demonstration_is_read_from_its_chat() -> None:
    path = DEMOS / "function_calling_simple.traj"
    [record] = iter_records(path)
    history = raw_json(path)["history"]
    assert kinds(record) == ["message"] * 2 + ["model_call", "command"] * 5
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.command for c in commands] == [m["action"] for m in history if m["role"] == "assistant"]
    assert [c.output for c in commands] == [m["content"] for m in history if m["role"] == "tool"]
    assert record.cost is None and record.metadata["usage"]["tokens_in"] is None


def test_a_step_that_saved_its_own_context_uses_it() -> None:
    path = (
        DEMOS
        / "replay__marshmallow-code__marshmallow-1867__function_calling_replace_from_source"
        / ("marshmallow-code__marshmallow-1867.traj")
    )
    [record] = iter_records(path)
    raw = raw_json(path)["trajectory"]
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [len(c.request_messages) for c in calls] == [len(e["messages"]) for e in raw]


@pytest.mark.parametrize("path", SWE_AGENT_FILES, ids=label)
def test_steps_match_the_raw_file(path: Path) -> None:
    raw = raw_json(path)
    [record] = iter_records(path)
    trajectory = raw.get("trajectory", [])
    expected_calls = len(trajectory) or sum(1 for m in raw["history"] if m["role"] == "assistant")
    assert kinds(record).count("model_call") == expected_calls
    commands = [s.command for s in record.steps if s.kind == "command"]
    if trajectory:
        assert commands == [e["action"] for e in trajectory]
        assert [s.output for s in record.steps if s.kind == "command"] == [
            e["observation"] for e in trajectory
        ]
    stats = raw.get("info", {}).get("model_stats", {})
    assert record.cost == stats.get("instance_cost")
    assert record.source_ref == f"swe-agent:{path.parent.name}/{path.name}"


def test_source_refs_are_distinct_across_runs_of_the_same_task() -> None:
    refs = [r.source_ref for path in SWE_AGENT_FILES for r in iter_records(path)]
    assert len(set(refs)) == len(refs) == 22


def test_a_caller_given_name_sets_the_source_ref() -> None:
    [record] = iter_records(PYDICOM, name="imports/2024-05/pydicom.traj")
    assert record.source_ref == "swe-agent:imports/2024-05/pydicom.traj"
