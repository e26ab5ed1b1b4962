"""Trove's own export: one TrajectoryRecord per line of JSONL, every field, lossless.

Each line is {"trove_format": "trove-trajectory-1", <every TrajectoryRecord field>, "steps": [<every
StepRecord field>, ...]} with request messages as objects of every MessageRecord field and times in
ISO 8601 (offset and microseconds kept). `experience.importers.trove` reads it back so that
parse(write(records)) == records for any record an importer produced.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from typing import IO, Any

from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT_MARKER = "trove-trajectory-1"
MARKER_KEY = "trove_format"
_TIME_FIELDS = frozenset({"started_at", "ended_at", "finished_at"})

TRAJECTORY_FIELDS = tuple(f.name for f in fields(TrajectoryRecord))
STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
MESSAGE_FIELDS = tuple(f.name for f in fields(MessageRecord))


def write(records: Iterable[TrajectoryRecord], fileobj: IO[Any]) -> int:
    """Write records one per line to a text or binary file object, one at a time. Returns how many."""
    binary = isinstance(fileobj, io.RawIOBase | io.BufferedIOBase) or "b" in getattr(fileobj, "mode", "")
    count = 0
    for record in records:
        line = dumps(record) + "\n"
        fileobj.write(line.encode() if binary else line)
        count += 1
    return count


def dumps(record: TrajectoryRecord) -> str:
    # ASCII escapes keep the file valid UTF-8 even for text holding lone surrogates from a source's JSON.
    return json.dumps(record_to_dict(record), ensure_ascii=True, separators=(",", ":"))


def record_to_dict(record: TrajectoryRecord) -> dict[str, Any]:
    data: dict[str, Any] = {MARKER_KEY: FORMAT_MARKER}
    for name in TRAJECTORY_FIELDS:
        value = getattr(record, name)
        data[name] = [step_to_dict(s) for s in value] if name == "steps" else _plain(name, value)
    return data


def step_to_dict(step: StepRecord) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in STEP_FIELDS:
        value = getattr(step, name)
        if name == "request_messages" and value is not None:
            value = [message_to_dict(m) for m in value]
        data[name] = _plain(name, value)
    return data


def message_to_dict(message: MessageRecord) -> dict[str, Any]:
    return {name: getattr(message, name) for name in MESSAGE_FIELDS}


def _plain(name: str, value: Any) -> Any:
    if name in _TIME_FIELDS and isinstance(value, datetime):
        return value.isoformat()
    return value


def record_from_dict(data: dict[str, Any]) -> TrajectoryRecord:
    """The inverse of record_to_dict. Raises KeyError / TypeError / ValueError on a malformed dict;
    the importer turns those into errors naming the line and field."""
    _exact_keys(data, {MARKER_KEY, *TRAJECTORY_FIELDS}, "")
    values = {name: data[name] for name in TRAJECTORY_FIELDS}
    if not isinstance(values["steps"], list):
        raise TypeError("steps: must be a list")
    values["steps"] = [_step_from_dict(s, i) for i, s in enumerate(values["steps"])]
    for name in _TIME_FIELDS & set(values):
        values[name] = _time(values[name], name)
    return TrajectoryRecord(**values)


def _step_from_dict(data: Any, index: int) -> StepRecord:
    where = f"steps[{index}]"
    if not isinstance(data, dict):
        raise TypeError(f"{where}: must be an object")
    _exact_keys(data, set(STEP_FIELDS), where + ".")
    values = dict(data)
    for name in _TIME_FIELDS & set(values):
        values[name] = _time(values[name], f"{where}.{name}")
    messages = values["request_messages"]
    if messages is not None:
        if not isinstance(messages, list):
            raise TypeError(f"{where}.request_messages: must be a list")
        values["request_messages"] = [
            _message_from_dict(m, f"{where}.request_messages[{i}]") for i, m in enumerate(messages)
        ]
    return StepRecord(**values)


def _message_from_dict(data: Any, where: str) -> MessageRecord:
    if not isinstance(data, dict):
        raise TypeError(f"{where}: must be an object")
    _exact_keys(data, set(MESSAGE_FIELDS), where + ".")
    return MessageRecord(**data)


def _exact_keys(data: dict[str, Any], expected: set[str], where: str) -> None:
    missing = sorted(expected - set(data))
    if missing:
        raise KeyError(f"{where}{missing[0]}")
    unknown = sorted(set(data) - expected)
    if unknown:
        raise ValueError(f"{where}{unknown[0]}: unknown field (written by a newer Trove?)")


def _time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{where}: must be an ISO 8601 time")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not an ISO 8601 time") from None
