"""OpenHands output.jsonl (evaluation and resolver) and event-stream files."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from experience.importers import iter_records
from experience.importers.base import task_hash
from importers.fixture_files import EVENT_STREAMS, MULTI_SWE, RESOLVER, raw_json, raw_jsonl


def response_ids(history: list[dict]) -> list[str]:
    ids: list[str] = []
    for event in history:
        response = (event.get("tool_call_metadata") or {}).get("model_response")
        if "action" in event and response and response["id"] not in ids:
            ids.append(response["id"])
    return ids


def test_multi_swe_bench_output_holds_three_runs_in_file_order() -> None:
    records = list(iter_records(MULTI_SWE))
    assert [r.task_key for r in records] == [
        "ponylang__ponyc-4595",
        "ponylang__ponyc-4593",
        "ponylang__ponyc-4588",
    ]
    assert [r.source_ref for r in records] == [
        f"openhands:examples/output.jsonl#{r.task_key}" for r in records
    ]
    assert {r.source_format for r in records} == {"openhands-output"}
    assert {r.source_version for r in records} == {"0.35.0"}
    assert {r.harness for r in records} == {"openhands/CodeActAgent"}
    assert {r.model for r in records} == {"openai/openrouter-llama-4-maverick"}


def test_one_model_call_per_model_response_with_its_tokens_and_latency() -> None:
    for raw, record in zip(raw_jsonl(MULTI_SWE), iter_records(MULTI_SWE), strict=True):
        calls = [s for s in record.steps if s.kind == "model_call"]
        usage = {u["response_id"]: u for u in raw["metrics"]["token_usages"]}
        latency = {x["response_id"]: x["latency"] for x in raw["metrics"]["response_latencies"]}
        assert [c.call_id for c in calls] == response_ids(raw["history"])
        assert [c.tokens_in for c in calls] == [usage[c.call_id]["prompt_tokens"] for c in calls]
        assert [c.latency_ms for c in calls] == [latency[c.call_id] * 1000 for c in calls]
        total = raw["metrics"]["accumulated_token_usage"]
        assert (
            sum(c.tokens_in for c in calls) == total["prompt_tokens"] == record.metadata["usage"]["tokens_in"]
        )
        assert sum(c.tokens_out for c in calls) == total["completion_tokens"]


def test_concrete_counts_of_the_ponyc_runs() -> None:
    records = list(iter_records(MULTI_SWE))
    assert [Counter(s.kind for s in r.steps)["model_call"] for r in records] == [23, 33, 49]
    assert [sum(s.tokens_in for s in r.steps if s.tokens_in) for r in records] == [565158, 410169, 938015]
    assert [Counter(s.kind for s in r.steps)["command"] for r in records] == [13, 12, 24]
    # a response OpenHands logged a latency for but that produced no action (the model erred)
    assert records[1].metadata["responses_without_action"] == ["gen-1746002773-cEtv7sjEX0xVQiCkirl6"]


def test_run_actions_become_commands_with_output_exit_code_and_timing() -> None:
    raw = raw_jsonl(MULTI_SWE)[1]
    record = list(iter_records(MULTI_SWE))[1]
    commands = [s for s in record.steps if s.kind == "command"]
    runs = [e for e in raw["history"] if e.get("action") == "run"]
    assert [c.command for c in commands] == [e["args"]["command"] for e in runs]
    answers = {e["cause"]: e for e in raw["history"] if e.get("observation") == "run"}
    assert [c.exit_code for c in commands] == [
        answers[e["id"]]["extras"]["metadata"]["exit_code"] for e in runs
    ]
    first = commands[0]
    assert first.command == "ls /workspace/ponylang__ponyc__0.1" and first.exit_code == 0
    assert first.started_at == datetime(2025, 4, 30, 16, 45, 43, 619026, tzinfo=UTC)
    assert first.ended_at == datetime(2025, 4, 30, 16, 45, 44, 238170, tzinfo=UTC)
    assert commands[1].exit_code == 2 and commands[1].output.startswith("ls: cannot access 'src/lib'")
    assert record.metadata["naive_timestamps_read_as_utc"] is True


def test_patch_error_and_outcome_of_the_runs() -> None:
    raws = raw_jsonl(MULTI_SWE)
    records = list(iter_records(MULTI_SWE))
    assert [r.final_diff for r in records] == [raw["test_result"]["git_patch"] for raw in raws]
    assert all(r.reward is None and r.success is None for r in records)  # no resolved label in this file
    last = records[2].steps[-1]
    assert last.kind == "note" and last.is_error
    assert last.text.startswith("RuntimeError: Agent reached maximum iteration in headless mode")
    assert records[0].cost == 0.0


def test_edits_with_a_diff_become_file_changes() -> None:
    records = list(iter_records(MULTI_SWE))
    assert [Counter(s.kind for s in r.steps)["file_change"] for r in records] == [1, 1, 4]
    change = next(s for s in records[0].steps if s.kind == "file_change")
    assert change.text.startswith("--- ") or change.text.startswith("diff")
    assert change.payload["path"].startswith("/workspace/ponylang__ponyc__0.1/")


def test_resolver_output_keeps_the_llm_judged_success_as_reward() -> None:
    records = list(iter_records(RESOLVER))
    raws = raw_jsonl(RESOLVER)
    assert [r.task_key for r in records] == ["neubig/pr-viewer#5", "neubig/pr-viewer#1"]
    assert [r.success for r in records] == [True, True] and [r.reward for r in records] == [1.0, 1.0]
    assert [r.cost for r in records] == [0.070713, 1.152933]
    assert [r.final_diff for r in records] == [raw["git_patch"] for raw in raws]
    verdicts = [r.steps[-1] for r in records]
    assert [v.kind for v in verdicts] == ["eval", "eval"]
    assert verdicts[0].text == raws[0]["result_explanation"]
    assert records[0].metadata["call_costs"] == raws[0]["metrics"]["costs"]


def test_resolver_runs_in_the_older_layout_pair_each_action_with_the_next_observation() -> None:
    record = next(iter_records(RESOLVER))
    assert [(s.kind, s.payload.get("role")) for s in record.steps] == [
        ("message", "user"),
        ("message", "assistant"),
        ("command", None),
        ("message", "assistant"),
        ("tool_call", None),
        ("observation", None),
        ("message", "assistant"),
        ("command", None),
        ("message", "assistant"),
        ("eval", None),
    ]
    touch, cat = [s for s in record.steps if s.kind == "command"]
    assert (touch.command, touch.exit_code) == ("touch LICENSE", 0)
    assert cat.command == "cat LICENSE" and cat.output.startswith("MIT License")
    assert record.instruction.startswith("Please fix the following issue for the repository in /workspace.")


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("basic.json", ["message", "model_call", "tool_call", "file_change", "model_call", "message"]),
        ("basic_interactions.json", ["message"] * 5 + ["model_call", "message"]),
        (
            "wrong_initial_state.json",
            [
                "message",
                "model_call",
                "tool_call",
                "observation",
                "model_call",
                "command",
                "model_call",
                "tool_call",
                "observation",
                "model_call",
                "message",
            ],
        ),
        (
            "basic_gui_mode.json",
            [
                "note",
                "note",
                "note",
                "message",
                "note",
                "model_call",
                "command",
                "model_call",
                "tool_call",
                "file_change",
                "model_call",
                "tool_call",
                "file_change",
                "model_call",
                "command",
                "message",
                "note",
            ],
        ),
    ],
)
def test_event_stream_files_map_each_event(name: str, kinds: list[str]) -> None:
    path = EVENT_STREAMS / name
    [record] = iter_records(path)
    assert [s.kind for s in record.steps] == kinds
    raw = raw_json(path)
    first_user = next(
        e["args"]["content"] for e in raw if e.get("action") == "message" and e["source"] == "user"
    )
    assert record.source_format == "openhands-events" and record.instruction == first_user
    assert record.task_key == task_hash(first_user)  # the file names no task: same instruction, same task
    assert record.source_ref == f"openhands:trajs/{name}"
    assert record.started_at == datetime.fromisoformat(raw[0]["timestamp"]).replace(tzinfo=UTC)
    assert record.finished_at == datetime.fromisoformat(raw[-1]["timestamp"]).replace(tzinfo=UTC)
    # every action, every observation but the "null" ones and those merged into their run command,
    # and one model call per distinct model response
    runs = {e["id"] for e in raw if e.get("action") == "run"}
    observations = [
        e for e in raw if "observation" in e and e["observation"] != "null" and e.get("cause") not in runs
    ]
    actions = [e for e in raw if "action" in e]
    assert len(record.steps) == len(actions) + len(observations) + len(response_ids(raw))


def test_a_timed_out_command_keeps_exit_code_minus_one() -> None:
    [record] = iter_records(EVENT_STREAMS / "basic_gui_mode.json")
    server = [s for s in record.steps if s.kind == "command"][1]
    assert server.command == "cd /workspace/todo-app && python3 -m http.server 8000"
    assert server.exit_code == -1
    assert (server.ended_at - server.started_at).total_seconds() == pytest.approx(30.58, abs=0.01)
