"""ATIF trajectories (sample in the shape Harbor writes for Claude Code)."""

from __future__ import annotations

from datetime import UTC, datetime

from experience.importers import iter_records
from importers.fixture_files import ATIF_SAMPLE, raw_json


def test_agent_steps_become_model_calls_and_their_tool_calls_actions() -> None:
    [record] = iter_records(ATIF_SAMPLE)
    assert [s.kind for s in record.steps] == [
        "message",
        "message",
        "model_call",
        "tool_call",
        "observation",
        "command",
        "model_call",
        "command",
        "model_call",
    ]
    write, cat = record.steps[3], record.steps[5]
    assert (
        write.tool_calls[0]["function"]["name"] == "Write" and write.payload["tool_call_id"] == "toolu_01HgM4"
    )
    assert record.steps[4].text == "File created successfully at: /app/hello.txt"
    assert (cat.command, cat.output) == ("cat /app/hello.txt", "Hello, world!")


def test_metrics_reasoning_and_run_fields() -> None:
    [record] = iter_records(ATIF_SAMPLE)
    raw = raw_json(ATIF_SAMPLE)
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [c.tokens_in for c in calls] == [s["metrics"]["prompt_tokens"] for s in raw["steps"][2:]]
    assert sum(c.tokens_in for c in calls) == raw["final_metrics"]["total_prompt_tokens"] == 41203
    assert sum(c.tokens_out for c in calls) == 246
    assert [c.payload["cost_usd"] for c in calls] == [0.00876, 0.00512, 0.00457]
    assert calls[0].text.startswith("Simple task: write the file")
    assert calls[0].started_at == datetime(2025, 10, 14, 9, 12, 6, 402000, tzinfo=UTC)
    assert record.source_format == "atif" and record.source_version == "ATIF-v1.4"
    assert record.source_ref == "atif:7f3c2a9e-5b1d-4e8a-9c0f-2d6b8e4a1c35"
    assert record.harness == "claude-code" and record.model == "claude-sonnet-4-20250514"
    assert record.cost == 0.01845 and record.metadata["agent_version"] == "1.0.98"
    assert record.instruction.startswith("Create a file called hello.txt")
