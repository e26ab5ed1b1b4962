"""OpenAI-format conversations in one JSON document (not JSONL): a JSON array of them, an object wrapping
such an array, one conversation object, or one bare array of messages. tau-bench's published trajectory
files (historical_trajectories/*.json, and the results its run.py writes) are of the first kind.

A conversation: {"messages" | "traj" | "conversation": [OpenAI chat messages], "task_id"?, "trial"?,
"reward"?, "success"?, "info"?, "model"?, "metadata"?, "id"?}. tau-bench writes {task_id, trial, reward,
info, traj}: one run per element, task key from `task_id`, the sample from `trial`, the reward as the
outcome (success derived from it, see experience.importers.outcomes) and `info` kept in metadata.
An object wrapping conversations holds them under one of WRAPPER_KEYS, or under its only key whose value
is a list of conversations; its other keys are kept in every run's metadata["collection"].

Steps are read as for the JSONL format (experience.importers.chat).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    UniqueRefs,
    as_dict,
    content_text,
    first_json_line,
    load_json_document,
    optional,
    ref_name,
    task_hash,
    text_or_empty,
)
from experience.importers.chat import steps_from_chat
from experience.importers.outcomes import REWARD_KEYS, SUCCESS_KEYS, outcome_of
from experience.records import TrajectoryRecord

FORMAT = "openai_conversations"
SOURCE_FORMAT = "openai-conversations"
MESSAGE_KEYS = ("messages", "traj", "conversation")
WRAPPER_KEYS = ("conversations", "trajectories", "results", "data", "runs", "samples", "items", "records")
_DOCUMENT = re.compile(rb"^\s*[\[{]")
# "messages": [ {"role" ... or "traj": [ { ...: a list of chat messages somewhere near the top
_MESSAGE_LIST = re.compile(rb'"(messages|traj|conversation)"\s*:\s*\[\s*\{\s*"(role|content)"\s*:')
_BARE_MESSAGES = re.compile(rb'^\s*\[\s*\{\s*"(role|content)"\s*:\s*(null|"[^"\\]{0,40}")\s*,\s*"(role|content)"')
_KNOWN_KEYS = {*MESSAGE_KEYS, *REWARD_KEYS, *SUCCESS_KEYS, "task_id", "task_key", "trial", "sample", "id", "info",
               "model", "metadata", "instruction"}


def detect(path: Path, head: bytes) -> bool:
    # JSONL of conversations is openai_messages' (one object per line, the first line complete in the head)
    if not _DOCUMENT.match(head) or _is_jsonl(head):
        return False
    return bool(_MESSAGE_LIST.search(head[:65536]) or _BARE_MESSAGES.match(head))


def _is_jsonl(head: bytes) -> bool:
    """One object per line: the first line is a whole object (or longer than the head, which a one-line
    document and a JSONL line read alike). A pretty-printed document opens with a bare bracket instead."""
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return False
    first = first_json_line(head)
    if isinstance(first, dict):  # a conversation on its line is JSONL; a one-line wrapping object is ours
        return _messages_key(first) is not None
    return b"\n" not in stripped


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    document = load_json_document(path)
    conversations, collection = _conversations(document, Location(path))
    refs = UniqueRefs()
    for index, conversation in enumerate(conversations):
        loc = Location(path, record=index)
        yield _record(path, name, conversation, loc, refs, collection)


def _conversations(document: Any, loc: Location) -> tuple[list[Any], dict[str, Any]]:
    """The conversations a document holds, and the wrapping object's other keys."""
    if isinstance(document, list):
        if document and all(_is_message(m) for m in document):
            return [{"messages": document}], {}  # one conversation given as its messages
        return document, {}
    if not isinstance(document, dict):
        raise loc.invalid(None, "the document must be a list of conversations or an object holding them")
    if _messages_key(document):
        return [document], {}
    key = _wrapper_key(document)
    if key is None:
        raise loc.invalid(None, f"no conversations found: expected a list under one of {', '.join(WRAPPER_KEYS)} "
                                f"or an object with {' / '.join(MESSAGE_KEYS)}")
    return document[key], {k: v for k, v in document.items() if k != key}


def _wrapper_key(document: dict[str, Any]) -> str | None:
    for key in WRAPPER_KEYS:
        if isinstance(document.get(key), list):
            return key
    lists = [k for k, v in document.items() if isinstance(v, list) and v and all(_is_conversation(c) for c in v)]
    return lists[0] if len(lists) == 1 else None


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and "role" in value and not _messages_key(value)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, dict) and _messages_key(value) is not None


def _messages_key(obj: dict[str, Any]) -> str | None:
    return next((k for k in MESSAGE_KEYS if isinstance(obj.get(k), list)), None)


def _record(
    path: Path, name: str | None, obj: Any, loc: Location, refs: UniqueRefs, collection: dict[str, Any]
) -> TrajectoryRecord:
    if not isinstance(obj, dict):
        raise loc.invalid(None, "each conversation must be a JSON object")
    key = _messages_key(obj)
    if key is None:
        raise loc.invalid("messages", f"missing (a conversation holds its messages under {' / '.join(MESSAGE_KEYS)})")
    messages = obj[key]
    steps = steps_from_chat(messages, loc, prefix=key)
    reward, success = outcome_of(obj, loc)
    instruction = text_or_empty(obj.get("instruction")) or _first_user(messages)
    task = obj.get("task_id", obj.get("task_key"))
    sample = obj.get("trial", obj.get("sample"))
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_ref=refs.take(f"openai-conversations:{ref_name(path, name)}#{_identity(obj, task, sample, loc)}"),
        task_key=str(task) if task is not None else task_hash(instruction),
        instruction=instruction,
        harness="tau-bench" if key == "traj" else "",
        model=str(obj.get("model") or next((s.model for s in steps if s.model), "") or ""),
        reward=reward,
        success=success,
        metadata=_metadata(obj, sample, collection, loc),
        steps=steps,
    )


def _identity(obj: dict[str, Any], task: Any, sample: Any, loc: Location) -> str:
    if obj.get("id") is not None:
        return str(obj["id"])
    if task is not None:
        return f"task-{task}" + (f"-trial-{sample}" if sample is not None else "")
    return f"record-{loc.record}"


def _metadata(obj: dict[str, Any], sample: Any, collection: dict[str, Any], loc: Location) -> dict[str, Any]:
    metadata = dict(optional(obj, "metadata", dict, loc) or {})
    if obj.get("info") is not None:
        metadata["info"] = obj["info"]
    if sample is not None:
        metadata["sample"] = sample
    if collection:
        metadata["collection"] = collection
    metadata.update({k: v for k, v in obj.items() if k not in _KNOWN_KEYS})
    return metadata


def _first_user(messages: list[Any]) -> str:
    for message in messages:
        if as_dict(message).get("role") == "user":
            return content_text(message.get("content"))
    return ""
