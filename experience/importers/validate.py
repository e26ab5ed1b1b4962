"""Full check of a TrajectoryRecord before an importer hands it out.

Every field is checked for type and range, so a record that leaves `iter_records` can be written without
surprises; the store's own limits (steps per run, content length) are the ingest service's to enforce.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from experience.importers.base import RESERVED_PAYLOAD_KEYS, Location
from experience.records import STEP_KINDS, TRAJECTORY_STATUSES, MessageRecord, StepRecord, TrajectoryRecord

_TEXT_FIELDS = (
    "source",
    "source_format",
    "source_ref",
    "task_key",
    "instruction",
    "source_version",
    "task_set",
    "harness",
    "model",
    "status",
    "final_diff",
)
_REQUIRED = ("source", "source_format", "source_ref", "task_key")


def validate_record(record: TrajectoryRecord, loc: Location) -> TrajectoryRecord:
    """Return the record unchanged, or raise ImportValidationError naming the first bad field."""
    if not isinstance(record, TrajectoryRecord):
        raise loc.invalid(None, "not a trajectory record")
    for name in _TEXT_FIELDS:
        _check(isinstance(getattr(record, name), str), loc, name, "must be text")
    for name in _REQUIRED:
        _check(bool(getattr(record, name)), loc, name, "missing")
    _check(
        record.status in TRAJECTORY_STATUSES, loc, "status", f"{record.status!r} is not a trajectory status"
    )
    _check_number(record.reward, loc, "reward")
    _check_number(record.cost, loc, "cost")
    _check(record.success is None or isinstance(record.success, bool), loc, "success", "must be true/false")
    _check_time(record.started_at, loc, "started_at")
    _check_time(record.finished_at, loc, "finished_at")
    _check(_is_json_object(record.metadata), loc, "metadata", "must be a JSON object")
    _check(isinstance(record.steps, list), loc, "steps", "must be a list")
    call_ids: set[str] = set()
    for index, step in enumerate(record.steps):
        _validate_step(step, loc, f"steps[{index}]", call_ids)
    return record


def _validate_step(step: Any, loc: Location, where: str, call_ids: set[str]) -> None:
    _check(isinstance(step, StepRecord), loc, where, "must be a step")
    _check(step.kind in STEP_KINDS, loc, f"{where}.kind", f"{step.kind!r} is not a step kind")
    _check(isinstance(step.text, str), loc, f"{where}.text", "must be text")
    for name in ("command", "output", "response_text", "model", "call_id"):
        value = getattr(step, name)
        _check(value is None or isinstance(value, str), loc, f"{where}.{name}", "must be text")
    for name in ("tokens_in", "tokens_out"):
        value = getattr(step, name)
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        _check(ok, loc, f"{where}.{name}", "must be a non-negative integer")
    for name in ("duration_ms", "latency_ms", "ttft_ms"):
        _check_number(getattr(step, name), loc, f"{where}.{name}")
    ok = step.exit_code is None or (isinstance(step.exit_code, int) and not isinstance(step.exit_code, bool))
    _check(ok, loc, f"{where}.exit_code", "must be an integer")
    _check(isinstance(step.is_error, bool), loc, f"{where}.is_error", "must be true/false")
    _check_time(step.started_at, loc, f"{where}.started_at")
    _check_time(step.ended_at, loc, f"{where}.ended_at")
    if step.started_at and step.ended_at:
        _check(step.ended_at >= step.started_at, loc, f"{where}.ended_at", "is earlier than started_at")
    _check_payload(step.payload, loc, f"{where}.payload")
    _check_messages(step.request_messages, loc, f"{where}.request_messages")
    _check(
        step.tool_calls is None or _is_json_list_of_objects(step.tool_calls),
        loc,
        f"{where}.tool_calls",
        "must be a list of objects",
    )
    _check(
        step.response_json is None or _is_json_object(step.response_json),
        loc,
        f"{where}.response_json",
        "must be a JSON object",
    )
    if step.call_id is not None:
        _check(
            step.call_id not in call_ids,
            loc,
            f"{where}.call_id",
            f"{step.call_id!r} repeats an earlier step's",
        )
        call_ids.add(step.call_id)


def _check_payload(payload: Any, loc: Location, where: str) -> None:
    _check(_is_json_object(payload), loc, where, "must be a JSON object")
    clash = sorted(RESERVED_PAYLOAD_KEYS & set(payload))
    _check(not clash, loc, where, f"uses the reserved key(s) {', '.join(clash)}")


def _check_messages(messages: Any, loc: Location, where: str) -> None:
    if messages is None:
        return
    _check(isinstance(messages, list), loc, where, "must be a list")
    for index, message in enumerate(messages):
        item = f"{where}[{index}]"
        _check(isinstance(message, MessageRecord), loc, item, "must be a message")
        _check(isinstance(message.role, str) and bool(message.role), loc, f"{item}.role", "must be text")
        _check(isinstance(message.content, str), loc, f"{item}.content", "must be text")
        _check(
            message.tool_calls is None or _is_json_list_of_objects(message.tool_calls),
            loc,
            f"{item}.tool_calls",
            "must be a list of objects",
        )


def _check_number(value: Any, loc: Location, where: str) -> None:
    ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    _check(ok, loc, where, "must be a number")


def _check_time(value: Any, loc: Location, where: str) -> None:
    ok = value is None or (isinstance(value, datetime) and value.tzinfo is not None)
    _check(ok, loc, where, "must be a timezone-aware time")


def _is_json_object(value: Any) -> bool:
    return isinstance(value, dict) and _is_json(value)


def _is_json_list_of_objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value) and _is_json(value)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _check(ok: bool, loc: Location, field: str, problem: str) -> None:
    if not ok:
        raise loc.invalid(field, problem)
