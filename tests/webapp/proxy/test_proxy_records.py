"""CallRecord: its JSON form for queues and its StepRecord form for the experience store."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from experience.records import MessageRecord
from webapp.proxy import jsonfast
from webapp.proxy.records import CallRecord


def _record(**overrides) -> CallRecord:
    started = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    values = dict(
        call_id="c" * 32,
        rollout_id="r1",
        trajectory_id="t1",
        started_at=started,
        ended_at=started + timedelta(milliseconds=250),
        latency_ms=250.0,
        ttft_ms=40.0,
        request={
            "model": "m",
            "temperature": 0.0,
            "tools": [{"type": "function", "function": {"name": "bash"}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}}],
                },
                {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function"}]},
                {"role": "tool", "content": "out", "tool_call_id": "x"},
            ],
        },
        response={
            "model": "m-2026",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "done", "reasoning_content": "hmm"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 7},
        },
        status_code=200,
        usage={"prompt_tokens": 100, "completion_tokens": 7},
        stream=True,
    )
    values.update(overrides)
    return CallRecord(**values)


def test_it_round_trips_through_json():
    record = _record()

    assert CallRecord.from_json(record.to_json()) == record


def test_unknown_keys_in_queued_json_are_ignored():
    data = _record().to_dict() | {"added_later": 1}

    assert CallRecord.from_dict(data) == _record()


def test_it_becomes_a_model_call_step():
    step = _record().to_step_record()

    assert step.kind == "model_call" and step.call_id == "c" * 32 and not step.is_error
    assert step.request_messages == [
        MessageRecord(role="system", content="sys"),
        MessageRecord(role="user", content="look\n[image_url]"),
        MessageRecord(role="assistant", content="", tool_calls=[{"id": "x", "type": "function"}]),
        MessageRecord(role="tool", content="out", tool_call_id="x"),
    ]
    assert (step.response_text, step.text, step.model) == ("done", "done", "m-2026")
    assert (step.tokens_in, step.tokens_out, step.latency_ms, step.ttft_ms) == (100, 7, 250.0, 40.0)
    assert step.duration_ms == 250.0 and step.started_at == _record().started_at
    assert step.payload["params"] == {
        "model": "m",
        "temperature": 0.0,
        "tools": [{"type": "function", "function": {"name": "bash"}}],
    }
    assert step.payload["reasoning"] == "hmm" and step.payload["finish_reason"] == "stop"
    assert step.payload["rollout_id"] == "r1" and step.payload["stream"] is True


def test_an_upstream_failure_becomes_an_error_step():
    record = _record(
        response={"error": {"message": "boom"}},
        status_code=500,
        usage=None,
        error="upstream 500: boom",
        error_kind="upstream_status",
    )

    step = record.to_step_record()

    assert record.is_error and step.is_error
    assert step.response_text is None and step.text == "upstream 500: boom"
    assert step.payload["error_kind"] == "upstream_status" and step.tokens_in is None


def test_a_record_with_an_error_but_status_200_is_an_error():
    assert _record(error="stream broke", error_kind="stream_broken").is_error


def test_json_the_fast_encoder_refuses_still_round_trips():
    # orjson rejects integers beyond 64 bits and NaN literals; a client or an upstream may send them.
    huge = 2**70
    record = _record(request={"messages": [], "seed": huge}, response={"score": float("nan"), "choices": []})

    back = CallRecord.from_json(record.to_json())

    assert back.request["seed"] == huge and back.started_at == record.started_at
    assert math.isnan(jsonfast.loads(b"{\"temperature\": NaN}")["temperature"])  # as json.loads parses it


def test_the_fast_encoder_writes_the_datetimes_to_dict_writes():
    record = _record()

    assert json.loads(record.to_json()) == record.to_dict()
