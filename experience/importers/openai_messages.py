"""OpenAI-format conversations, one per line of a JSONL file.

A line: {"messages": [OpenAI chat messages, assistant ones with tool_calls, tool ones with tool_call_id],
"task_id"?, "id"?, "reward"?, "success"?, "model"?, "metadata"?}. Other keys are kept in metadata. The outcome
may be named as other sources name it (score, resolved, passed, ...: experience.importers.outcomes).

Steps: see experience.importers.chat (assistant -> model_call with the preceding messages as context;
shell tool calls -> command with the tool answer as output; other tool calls -> tool_call + observation).
A line without task_id is grouped by its first user message: task_key "sha256:<first 16 hex>".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers import conversations
from experience.importers.base import (
    Location,
    UniqueRefs,
    as_dict,
    content_text,
    first_json_line,
    first_line,
    iter_jsonl,
    optional,
    read_head,
    ref_name,
    require,
    task_hash,
    text_or_empty,
)
from experience.importers.chat import steps_from_chat
from experience.importers.outcomes import REWARD_KEYS, SUCCESS_KEYS, outcome_of
from experience.records import TrajectoryRecord

FORMAT = "openai_messages"
SOURCE_FORMAT = "openai-messages"
_MESSAGES = re.compile(rb'"messages"\s*:\s*\[\s*\{\s*"role"')
_KNOWN_KEYS = {"messages", "task_id", "task_key", "id", "model", "metadata", "instruction", *REWARD_KEYS, *SUCCESS_KEYS}


def detect(path: Path, head: bytes) -> bool:
    line = first_json_line(head)
    if isinstance(line, dict):
        messages = line.get("messages")
        return isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)
    start = first_line(head)  # a first line longer than the head
    return start.startswith(b"{") and bool(_MESSAGES.search(start))


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    if conversations.detect(path, read_head(path)):  # one JSON document (an array): not JSONL, read it whole
        yield from conversations.parse(path, name=name)
        return
    refs = UniqueRefs()
    for record_index, (line, obj) in enumerate(iter_jsonl(path)):
        yield _record(path, name, obj, Location(path, line=line, record=record_index), refs)


def _record(path: Path, name: str | None, obj: Any, loc: Location, refs: UniqueRefs) -> TrajectoryRecord:
    if not isinstance(obj, dict):
        raise loc.invalid(None, "each line must be a JSON object")
    messages = require(obj, "messages", list, loc)
    steps = steps_from_chat(messages, loc)
    reward, success = outcome_of(obj, loc)  # reward / score, success / resolved / passed ... (outcomes)
    identity = obj.get("id") if obj.get("id") is not None else f"line-{loc.line}"
    instruction = text_or_empty(obj.get("instruction")) or _first_user(messages)
    metadata = dict(optional(obj, "metadata", dict, loc) or {})
    metadata.update({k: v for k, v in obj.items() if k not in _KNOWN_KEYS})
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_ref=refs.take(f"openai-messages:{ref_name(path, name)}#{identity}"),
        task_key=str(obj.get("task_id") or obj.get("task_key") or task_hash(instruction)),
        instruction=instruction,
        model=str(obj.get("model") or next((s.model for s in steps if s.model), "") or ""),
        reward=reward,
        success=success,
        metadata=metadata,
        steps=steps,
    )


def _first_user(messages: list[Any]) -> str:
    for message in messages:
        if as_dict(message).get("role") == "user":
            return content_text(message.get("content"))
    return ""
