"""Checking a TrajectoryRecord before any of it is written: the same rules the importers apply
(experience.importers.validate: every field's type and range), plus the store's own limits (steps per run,
characters per text) and what Postgres can keep (no NUL, valid Unicode in text columns).

Written for the bulk path: a model call's context repeats the earlier calls' messages, so each distinct
MessageRecord object is checked once per record, not once per call that shows it (that was quadratic).
Errors are ValidationError (LimitExceeded for limits) naming the field, prefixed by the caller's `where`,
e.g. "trajectories[3].steps[7].tokens_in: must be a non-negative integer".
"""

from __future__ import annotations

import json
import operator
from datetime import datetime
from typing import Any

from django.conf import settings

from experience.errors import LimitExceeded, ValidationError
from experience.importers.base import RESERVED_PAYLOAD_KEYS
from experience.records import STEP_KINDS, TRAJECTORY_STATUSES, MessageRecord, StepRecord, TrajectoryRecord
from experience.steps import storable, storable_json

_RUN_TEXT = ("source", "source_format", "source_ref", "task_key", "instruction", "source_version", "task_set",
             "harness", "model", "status", "final_diff")
_REQUIRED = ("source", "source_ref", "task_key")
_STEP_TEXT = ("command", "output", "response_text", "model", "call_id")
_LIMITED = ("text", "output", "response_text", "command")
_INFINITIES = (float("inf"), float("-inf"))


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where
        self.limit = settings.TROVE_MAX_CONTENT_CHARS
        self.call_ids: set[str] = set()
        self.messages_seen: set[int] = set()
        self.last_context: list[Any] = []  # a copy of the previous call's context (its messages were checked)

    def fail(self, field: str, problem: str, *, limit: bool = False) -> None:
        name = f"{self.where}{field}"
        raise (LimitExceeded if limit else ValidationError)(f"{name}: {problem}", field=name)

    def check(self, ok: bool, field: str, problem: str) -> None:
        if not ok:
            self.fail(field, problem)


def validate_trajectory(record: Any, *, where: str = "") -> None:
    """Raise naming the first bad field of `record`, or return: the record can be written as it is."""
    c = _Checker(where)
    if not isinstance(record, TrajectoryRecord):
        c.fail("record", "not a trajectory record")
    _check_run(c, record)
    if not isinstance(record.steps, list):
        c.fail("steps", "must be a list")
    steps_limit = settings.TROVE_MAX_STEPS_PER_TRAJECTORY
    if len(record.steps) > steps_limit:
        c.fail("steps", f"{len(record.steps)} exceeds the limit of {steps_limit} per trajectory", limit=True)
    for index, step in enumerate(record.steps):
        _check_step(c, step, f"steps[{index}]")


def validate_step(record: Any, *, index: int, where: str = "") -> None:
    """Check one step on its own (the live path appends steps to a stored run)."""
    _check_step(_Checker(where), record, f"steps[{index}]")


def _check_run(c: _Checker, record: TrajectoryRecord) -> None:
    for name in _RUN_TEXT:
        value = getattr(record, name)
        c.check(isinstance(value, str), name, "must be text")
        if len(value) > c.limit:
            c.fail(name, f"{len(value)} characters exceeds the limit of {c.limit}", limit=True)
        c.check(storable(value), name, "contains a NUL character or invalid Unicode")
    for name in _REQUIRED:
        c.check(bool(getattr(record, name)), name, "required")
    c.check(record.status in TRAJECTORY_STATUSES, "status",
            f"{record.status!r} is not one of {', '.join(TRAJECTORY_STATUSES)}")
    _number(c, record.reward, "reward")
    _number(c, record.cost, "cost")
    c.check(record.success is None or isinstance(record.success, bool), "success", "must be true/false")
    _time(c, record.started_at, "started_at")
    _time(c, record.finished_at, "finished_at")
    c.check(isinstance(record.metadata, dict), "metadata", "must be a JSON object")
    c.check(storable_json(_json(c, record.metadata, "metadata")), "metadata", "contains a NUL character or invalid Unicode")


def _check_step(c: _Checker, step: Any, at: str) -> None:
    # Hot path (every step of every run): conditions first, messages only built on failure.
    if not isinstance(step, StepRecord):
        c.fail(at, "must be a step")
    if step.kind not in STEP_KINDS:
        c.fail(f"{at}.kind", f"{step.kind!r} is not one of {', '.join(STEP_KINDS)}")
    if not isinstance(step.text, str):
        c.fail(f"{at}.text", "must be text")
    for name in _STEP_TEXT:
        value = getattr(step, name)
        if value is not None and not isinstance(value, str):
            c.fail(f"{at}.{name}", "must be text")
    for name in _LIMITED:
        value = getattr(step, name)
        if value is not None and len(value) > c.limit:
            c.fail(f"{at}.{name}", f"{len(value)} characters exceeds the limit of {c.limit}", limit=True)
    for name in ("tokens_in", "tokens_out"):
        value = getattr(step, name)
        if value is not None and not (type(value) is int and 0 <= value < 2**31):
            c.fail(f"{at}.{name}", "must be a non-negative integer")
    for name in ("duration_ms", "latency_ms", "ttft_ms"):
        _number(c, getattr(step, name), f"{at}.{name}")
    if step.exit_code is not None and not (type(step.exit_code) is int and -(2**31) <= step.exit_code < 2**31):
        c.fail(f"{at}.exit_code", "must be an integer")
    if not isinstance(step.is_error, bool):
        c.fail(f"{at}.is_error", "must be true/false")
    _check_times(c, step, at)
    _check_payload(c, step.payload, f"{at}.payload")
    if step.request_messages is not None:
        _check_messages(c, step.request_messages, f"{at}.request_messages")
    if step.tool_calls is not None:
        _objects(c, step.tool_calls, f"{at}.tool_calls")
    if step.response_json is not None:
        if not isinstance(step.response_json, dict):
            c.fail(f"{at}.response_json", "must be a JSON object")
        _json(c, step.response_json, f"{at}.response_json")
    if step.call_id is not None:
        if step.call_id in c.call_ids:
            c.fail(f"{at}.call_id", f"{step.call_id!r} repeats an earlier step's")
        c.call_ids.add(step.call_id)


def _check_times(c: _Checker, step: StepRecord, at: str) -> None:
    started, ended = step.started_at, step.ended_at
    if started is not None:
        _time(c, started, f"{at}.started_at")
    if ended is not None:
        _time(c, ended, f"{at}.ended_at")
    if started and ended and ended < started:
        c.fail(f"{at}.ended_at", "is earlier than started_at")


def _check_payload(c: _Checker, payload: Any, where: str) -> None:
    if not isinstance(payload, dict):
        c.fail(where, "must be a JSON object")
    if payload:
        clash = RESERVED_PAYLOAD_KEYS.intersection(payload)
        if clash:
            c.fail(where, f"uses the reserved key(s) {', '.join(sorted(clash))}")
        _json(c, payload, where)


def _check_messages(c: _Checker, messages: Any, where: str) -> None:
    if not isinstance(messages, list):
        c.fail(where, "must be a list")
    last = c.last_context
    # A context that extends the previous call's (the same objects, then more) needs only its new tail checked.
    start = len(last) if len(last) <= len(messages) and all(map(operator.is_, last, messages)) else 0
    c.last_context = list(messages)
    seen = c.messages_seen
    for index in range(start, len(messages)):
        message = messages[index]
        if id(message) in seen:
            continue  # the same object, checked in an earlier call's context
        item = f"{where}[{index}]"
        if not isinstance(message, MessageRecord):
            c.fail(item, "must be a message")
        if not (isinstance(message.role, str) and message.role):
            c.fail(f"{item}.role", "must be text")
        if not isinstance(message.content, str):
            c.fail(f"{item}.content", "must be text")
        for name in ("name", "tool_call_id"):
            value = getattr(message, name)
            if value is not None and not isinstance(value, str):
                c.fail(f"{item}.{name}", "must be text")
        if message.tool_calls is not None:
            _objects(c, message.tool_calls, f"{item}.tool_calls")
        seen.add(id(message))  # safe: the record keeps every message alive while we check


def _objects(c: _Checker, value: Any, where: str) -> None:
    ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
    c.check(ok, where, "must be a list of objects")
    _json(c, value, where)


_STRICT = json.JSONEncoder(allow_nan=False, ensure_ascii=False)  # built once: this runs for every step


def _json(c: _Checker, value: Any, where: str) -> str:
    try:
        return _STRICT.encode(value)
    except (TypeError, ValueError) as error:
        c.fail(where, f"is not JSON ({error})")
        raise AssertionError("unreachable") from None


def _number(c: _Checker, value: Any, where: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in _INFINITIES:
        c.fail(where, "must be a number")


def _time(c: _Checker, value: Any, where: str) -> None:
    if value is not None and not (isinstance(value, datetime) and value.tzinfo is not None):
        c.fail(where, "must be a timezone-aware time")
