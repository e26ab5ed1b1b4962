"""Turning StepRecords into Step rows and back. ORM-free apart from the Step class it instantiates.

Short text stays inline in `payload`; text longer than INLINE_LIMIT and every model call's request
messages go to blobs (`blob_refs`), so repeated context is stored once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from experience.records import MessageRecord, StepRecord

INLINE_LIMIT = 2048
PREVIEW_CHARS = 300
TEXT_FIELDS = ("text", "output", "response_text")


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def preview_of(record: StepRecord) -> str:
    if record.kind == "command" and record.command:
        return record.command[:PREVIEW_CHARS]
    for candidate in (record.response_text, record.text, record.output):
        if candidate:
            return candidate[:PREVIEW_CHARS]
    if record.tool_calls:
        return json.dumps(record.tool_calls)[:PREVIEW_CHARS]
    return ""


@dataclass
class PreparedStep:
    """A StepRecord split into inline fields and blob contents (not yet stored)."""

    record: StepRecord
    payload: dict[str, Any]
    blob_contents: dict[str, bytes | list[bytes]] = field(default_factory=dict)


def prepare_step(record: StepRecord) -> PreparedStep:
    payload: dict[str, Any] = dict(record.payload)
    blobs: dict[str, bytes | list[bytes]] = {}
    for name in TEXT_FIELDS:
        value = getattr(record, name)
        if value is None or value == "":
            continue
        if len(value) > INLINE_LIMIT:
            blobs[name] = value.encode()
        else:
            payload[name] = value
    for name in ("command", "tool_calls", "model", "latency_ms", "ttft_ms"):
        value = getattr(record, name)
        if value is not None:
            payload[name] = value
    if record.request_messages is not None:
        blobs["request_messages"] = [canonical_json(m.as_openai()) for m in record.request_messages]
    if record.response_json is not None:
        blobs["response_json"] = canonical_json(record.response_json)
    return PreparedStep(record=record, payload=payload, blob_contents=blobs)


def all_blob_contents(prepared: list[PreparedStep]) -> list[bytes]:
    contents: list[bytes] = []
    for item in prepared:
        for value in item.blob_contents.values():
            contents.extend(value if isinstance(value, list) else [value])
    return contents


def blob_refs_for(item: PreparedStep, digest_of: dict[bytes, str]) -> dict[str, Any]:
    refs: dict[str, Any] = {}
    for name, value in item.blob_contents.items():
        refs[name] = [digest_of[v] for v in value] if isinstance(value, list) else digest_of[value]
    return refs


def step_record_from_parts(
    *, kind: str, payload: dict[str, Any], blob_refs: dict[str, Any], blobs: dict[str, bytes], **columns: Any
) -> StepRecord:
    """The inverse of prepare_step: rebuild a StepRecord from a row's fields and its fetched blobs."""
    payload = dict(payload)
    texts = {name: payload.pop(name, None) for name in TEXT_FIELDS}
    for name in TEXT_FIELDS:
        if name in blob_refs:
            texts[name] = blobs[blob_refs[name]].decode()
    request_messages = None
    if "request_messages" in blob_refs:
        request_messages = [MessageRecord(**json.loads(blobs[h])) for h in blob_refs["request_messages"]]
    response_json = json.loads(blobs[blob_refs["response_json"]]) if "response_json" in blob_refs else None
    named = {name: payload.pop(name, None) for name in ("command", "tool_calls", "model", "latency_ms", "ttft_ms")}
    return StepRecord(
        kind=kind,
        text=texts["text"] or "",
        output=texts["output"],
        response_text=texts["response_text"],
        request_messages=request_messages,
        response_json=response_json,
        payload=payload,
        **named,
        **columns,
    )


def referenced_hashes(blob_refs: dict[str, Any]) -> list[str]:
    hashes: list[str] = []
    for value in blob_refs.values():
        hashes.extend(value if isinstance(value, list) else [value])
    return hashes
