"""Trove's own JSONL export: parse(write(records)) == records, for the runs of every importer."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from importers.fixture_files import ALL_FILES, MULTI_SWE, label

from experience.exporters import trove_jsonl
from experience.importers import detect_format, iter_records, read_all
from experience.records import MessageRecord, StepRecord, TrajectoryRecord


def round_trip(records: list[TrajectoryRecord], path: Path) -> list[TrajectoryRecord]:
    with open(path, "w") as handle:
        assert trove_jsonl.write(records, handle) == len(records)
    assert detect_format(path) == "trove"
    return read_all(path)


@pytest.mark.parametrize("source", ALL_FILES, ids=label)
def test_every_importers_records_come_back_equal(source: Path, tmp_path: Path) -> None:
    records = read_all(source)
    assert records
    assert round_trip(records, tmp_path / "export.jsonl") == records


def every_field_record() -> TrajectoryRecord:
    india = timezone(timedelta(hours=5, minutes=30))
    call = StepRecord(
        kind="model_call",
        started_at=datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=india),
        ended_at=datetime(2025, 3, 1, 12, 0, 1, 654321, tzinfo=india),
        duration_ms=1530.865,
        text="thinking \u2014 r\u00e9sum\u00e9 \U0001f680 and a lone surrogate \udc80",
        request_messages=[
            MessageRecord(role="system", content="be brief"),
            MessageRecord(
                role="assistant",
                content="",
                name="agent-1",
                tool_calls=[
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
                ],
            ),
            MessageRecord(role="tool", content="ok", tool_call_id="c1"),
        ],
        response_text="done",
        response_json={
            "id": "resp-1",
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},
            "nested": [1, 2.5, None, True],
        },
        tool_calls=[
            {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"path": "/a"}'}}
        ],
        model="m-1",
        tokens_in=12,
        tokens_out=3,
        latency_ms=1530.865,
        ttft_ms=88.0,
        call_id="resp-1",
        is_error=True,
        payload={"cost": 0.0001, "list": [1, {"a": "b"}]},
    )
    command = StepRecord(
        kind="command",
        command="exit 3",
        output="",
        exit_code=-3,
        started_at=datetime(2025, 3, 1, 6, 30, tzinfo=UTC),
    )
    return TrajectoryRecord(
        source="api",
        source_format="custom",
        source_ref="api:run/1",
        task_key="t/1",
        instruction="do it",
        source_version="9",
        task_set="set",
        harness="h",
        model="m-1",
        status="failed",
        reward=-0.25,
        success=False,
        started_at=datetime(2025, 3, 1, 6, 29, 59, 1, tzinfo=UTC),
        finished_at=datetime(2025, 3, 1, 6, 31, tzinfo=UTC),
        cost=1e-9,
        final_diff="diff --git a/x b/x\n",
        metadata={"k": [1, 2], "unicode": "\u00fc"},
        steps=[call, command],
    )


def test_a_record_with_every_field_set_comes_back_equal(tmp_path: Path) -> None:
    record = every_field_record()
    [back] = round_trip([record], tmp_path / "export.jsonl")
    assert back == record
    assert back.steps[0].started_at.utcoffset() == timedelta(hours=5, minutes=30)


def test_lines_hold_every_field_with_times_in_iso_8601() -> None:
    buffer = io.StringIO()
    trove_jsonl.write([every_field_record()], buffer)
    [line] = buffer.getvalue().splitlines()
    data = json.loads(line)
    assert data["trove_format"] == "trove-trajectory-1"
    assert set(data) == {"trove_format", *trove_jsonl.TRAJECTORY_FIELDS}
    assert set(data["steps"][0]) == set(trove_jsonl.STEP_FIELDS)
    assert data["started_at"] == "2025-03-01T06:29:59.000001+00:00"
    assert data["steps"][0]["ended_at"] == "2025-03-01T12:00:01.654321+05:30"
    assert data["steps"][0]["request_messages"][2] == {
        "role": "tool",
        "content": "ok",
        "name": None,
        "tool_calls": None,
        "tool_call_id": "c1",
    }
    line.encode("ascii")  # non-ASCII text is escaped, so any byte-oriented tool reads the file


def test_binary_file_objects_get_the_same_bytes() -> None:
    records = read_all(MULTI_SWE)
    text, binary = io.StringIO(), io.BytesIO()
    trove_jsonl.write(records, text)
    trove_jsonl.write(records, binary)
    assert binary.getvalue() == text.getvalue().encode()


def test_a_reimported_export_keeps_the_original_identity(tmp_path: Path) -> None:
    records = read_all(MULTI_SWE)
    back = round_trip(records, tmp_path / "elsewhere.jsonl")
    assert [(r.source, r.source_format, r.source_ref) for r in back] == [
        ("import", "openhands-output", f"openhands:examples/output.jsonl#{key}")
        for key in ("ponylang__ponyc-4595", "ponylang__ponyc-4593", "ponylang__ponyc-4588")
    ]


def test_write_streams_records_from_a_generator(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    with open(path, "wb") as handle:
        count = trove_jsonl.write(iter_records(MULTI_SWE), handle)
    assert count == 3 and len(path.read_bytes().splitlines()) == 3
