"""JSONL of OpenAI-format conversations with tool calls (sample file)."""

from __future__ import annotations

from experience.importers import iter_records
from importers.fixture_files import CONVERSATIONS, raw_jsonl


def test_each_line_is_one_run_with_its_reward_and_success() -> None:
    records = list(iter_records(CONVERSATIONS))
    assert [r.task_key for r in records] == ["fix-failing-test-42", records[1].task_key, "count-lines"]
    assert records[1].task_key.startswith("sha256:") and len(records[1].task_key) == 7 + 16
    assert [r.reward for r in records] == [1.0, 0.0, 0.5]
    assert [r.success for r in records] == [True, False, None]
    assert [r.source_ref for r in records] == [
        "openai-messages:samples/conversations.jsonl#run-0001",
        "openai-messages:samples/conversations.jsonl#line-2",
        "openai-messages:samples/conversations.jsonl#run-0003",
    ]


def test_shell_calls_become_commands_and_other_tools_tool_calls_with_observations() -> None:
    record = next(iter_records(CONVERSATIONS))
    assert [s.kind for s in record.steps] == [
        "message",
        "message",
        "model_call",
        "command",
        "model_call",
        "tool_call",
        "observation",
        "model_call",
        "tool_call",
        "observation",
        "command",
        "model_call",
    ]
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.command for c in commands] == ["cd /repo && python -m pytest tests/test_slug.py -q"] * 2
    assert commands[1].output == "..\n2 passed in 0.03s"
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [len(c.request_messages) for c in calls] == [2, 4, 6, 9]
    assert calls[0].response_text == "" and calls[-1].response_text.startswith("Fixed: slugify")


def test_parallel_tool_answers_are_matched_by_id_not_position() -> None:
    record = list(iter_records(CONVERSATIONS))[2]
    raw = raw_jsonl(CONVERSATIONS)[2]
    first, second = [s for s in record.steps if s.kind == "command"][:2]
    assert (first.payload["tool_call_id"], first.output) == ("call_c1", "17")
    assert (second.payload["tool_call_id"], second.output) == ("call_c2", "1290")
    later_user_turn = record.steps[6]
    assert later_user_turn.kind == "message" and later_user_turn.text == raw["messages"][6]["content"]
