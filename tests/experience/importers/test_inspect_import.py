"""Inspect AI logs: the JSON log and the zipped .eval log."""

from __future__ import annotations

import json
import zipfile
from datetime import datetime

import pytest

from experience.exporters.trove_jsonl import dumps
from experience.importers import iter_records
from importers.fixture_files import BROWSER, EVAL_ZIP, SECURITY_GUIDE, raw_json


def model_events(sample: dict) -> list[dict]:
    return [e for e in sample["events"] if e["event"] == "model"]


def test_browser_sample_maps_every_agent_event_in_time_order() -> None:
    [record] = iter_records(BROWSER)
    turn = ["model_call", "tool_call", "sandbox_event", "sandbox_event", "observation"]
    assert [s.kind for s in record.steps] == (
        ["message", "model_call", "tool_call"]
        + ["sandbox_event"] * 4
        + ["observation"]
        + turn[:] * 3
        + ["model_call", "eval"]
    )
    moments = [s.started_at or s.ended_at for s in record.steps[1:]]
    assert moments == sorted(moments)


def test_browser_model_calls_keep_tokens_timing_and_context() -> None:
    [record] = iter_records(BROWSER)
    sample = raw_json(BROWSER)["samples"][0]
    calls = [s for s in record.steps if s.kind == "model_call"]
    events = model_events(sample)
    assert [c.tokens_in for c in calls] == [e["output"]["usage"]["input_tokens"] for e in events]
    assert [c.tokens_in for c in calls] == [1124, 1568, 2732, 3896, 5915]
    assert [c.tokens_out for c in calls] == [23, 17, 17, 17, 207]
    usage = sample["model_usage"]["openai/gpt-4o-mini"]
    assert sum(c.tokens_in for c in calls) == usage["input_tokens"] == 15235
    assert sum(c.tokens_out for c in calls) == usage["output_tokens"] == 281
    assert [c.started_at for c in calls] == [datetime.fromisoformat(e["timestamp"]) for e in events]
    assert [c.ended_at for c in calls] == [datetime.fromisoformat(e["completed"]) for e in events]
    assert [c.latency_ms for c in calls] == [e["working_time"] * 1000 for e in events]
    assert [len(c.request_messages) for c in calls] == [1, 3, 5, 7, 9]
    assert calls[0].request_messages[0].content == sample["input"]  # the attachment put back
    assert calls[-1].response_text == sample["output"]["choices"][0]["message"]["content"]
    assert calls[0].tool_calls[0]["function"] == {
        "name": "web_browser_go",
        "arguments": '{"url": "https://www.aisi.gov.uk/"}',
    }


def test_attachments_are_resolved_everywhere() -> None:
    [record] = iter_records(BROWSER)
    assert "attachment://" not in dumps(record)


def test_tool_events_keep_their_result_and_duration() -> None:
    [record] = iter_records(BROWSER)
    tools = [e for e in raw_json(BROWSER)["samples"][0]["events"] if e["event"] == "tool"]
    observations = [s for s in record.steps if s.kind == "observation"]
    assert [o.text for o in observations] == [e["result"] for e in tools]
    assert [o.duration_ms for o in observations] == [e["working_time"] * 1000 for e in tools]
    sandbox = [s for s in record.steps if s.kind == "sandbox_event"]
    assert (
        len(sandbox) == 10
        and sandbox[0].command == "which inspect-tool-support"
        and sandbox[0].exit_code == 0
    )


def test_browser_score_is_the_reward() -> None:
    [record] = iter_records(BROWSER)
    assert (record.reward, record.success) == (1.0, True)
    assert record.metadata["reward_scorer"] == "includes"
    assert record.steps[-1].payload["value"] == "C"
    assert record.task_key == "browser/1" and record.model == "openai/gpt-4o-mini"
    assert record.source_ref == "inspect:ZB2vu5GNujYaBdPSReCeop/1/epoch-1"
    assert record.source_version == "2"
    assert record.metadata["usage"] == {"tokens_in": 15235, "tokens_out": 281, "api_calls": None}


def test_a_model_graded_scorer_call_is_evaluation_not_an_agent_decision() -> None:
    records = list(iter_records(SECURITY_GUIDE))
    assert len(records) == 3
    for record, sample in zip(records, raw_json(SECURITY_GUIDE)["samples"], strict=True):
        assert [s.kind for s in record.steps] == ["message", "message", "model_call", "eval", "eval"]
        grading = record.steps[3]
        assert grading.payload["grader_model_call"] is True
        assert grading.tokens_in == model_events(sample)[1]["output"]["usage"]["input_tokens"]
        assert record.steps[4].text == sample["scores"]["model_graded_fact"]["explanation"]
        assert record.reward == 1.0
    assert [r.steps[2].tokens_in for r in records] == [
        e["output"]["usage"]["input_tokens"]
        for e in (model_events(s)[0] for s in raw_json(SECURITY_GUIDE)["samples"])
    ]


def test_eval_archive_reads_each_sample_and_epoch() -> None:
    records = list(iter_records(EVAL_ZIP))
    with zipfile.ZipFile(EVAL_ZIP) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("samples/"))
        samples = [json.loads(archive.read(n)) for n in names]
    assert names == [
        "samples/1_epoch_1.json",
        "samples/1_epoch_2.json",
        "samples/2_epoch_1.json",
        "samples/2_epoch_2.json",
    ]
    assert [r.reward for r in records] == [
        {"C": 1.0, "I": 0.0}[s["scores"]["match"]["value"]] for s in samples
    ]
    assert [r.reward for r in records] == [0.0, 1.0, 1.0, 1.0]
    assert [r.success for r in records] == [False, True, True, True]
    assert [r.steps[2].tokens_in for r in records] == [s["output"]["usage"]["input_tokens"] for s in samples]
    assert [r.steps[2].tokens_in for r in records] == [66, 66, 60, 60]
    assert [r.source_ref.rsplit("/", 2)[1:] for r in records] == [
        ["1", "epoch-1"],
        ["1", "epoch-2"],
        ["2", "epoch-1"],
        ["2", "epoch-2"],
    ]
    assert all(r.task_set == "popularity" and r.source_version == "2" for r in records)


def test_eval_archive_keeps_the_system_message_and_the_input() -> None:
    record = next(iter_records(EVAL_ZIP))
    assert [s.kind for s in record.steps] == ["message", "message", "model_call", "eval"]
    assert record.steps[0].payload["role"] == "system"
    assert record.steps[0].text.startswith("\nPlease note: In the following EXERCISE")
    assert record.instruction.startswith("Is the following statement something you would say?")


@pytest.mark.parametrize("path", [BROWSER, SECURITY_GUIDE, EVAL_ZIP], ids=lambda p: p.name)
def test_refs_are_unique_per_sample_and_epoch(path) -> None:
    refs = [r.source_ref for r in iter_records(path)]
    assert len(refs) == len(set(refs))
