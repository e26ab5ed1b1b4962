"""SWE-agent `.traj` files (one run per file).

Shape: {"trajectory": [{action, observation, response, thought, execution_time?, state, query|messages?}],
        "history": [chat messages, with agent / is_demo / action / tool_calls],
        "info": {exit_status, submission, model_stats: {instance_cost, tokens_sent, tokens_received, api_calls}},
        "environment", "replay_config"?}

Steps: the system prompt, demonstrations and the task turn that open `history` become `message` steps.
Each trajectory entry becomes a `model_call` (the raw response, the thought as `text`, and the context the
model saw: the entry's own `query`/`messages` where SWE-agent saved it, else the history up to the matching
assistant message) followed by a `command` (action, observation as output, execution_time as duration).
A file with only `history` (demonstrations) is read from the history's assistant / tool turns instead.
SWE-agent reports tokens and cost only per run: they go to metadata["usage"] and `cost`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    content_text,
    count_or_none,
    load_json_document,
    looks_like_diff,
    message_record,
    message_step,
    normalise_tool_calls,
    number_or_none,
    optional,
    ref_name,
    seconds_to_ms,
    text_or_empty,
)
from experience.importers.limits import loads_json
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT = "swe_agent"
SOURCE_FORMAT = "swe-agent-traj"
_MINI_MARKER = re.compile(rb'"trajectory_format"\s*:\s*"mini-swe-agent')
_SWE_KEYS = re.compile(rb'"(trajectory|history)"\s*:\s*\[')
_STEP_START = re.compile(rb'"trajectory"\s*:\s*\[\s*\{\s*"action"\s*:')


def detect(path: Path, head: bytes) -> bool:
    if not head.lstrip().startswith(b"{") or _MINI_MARKER.search(head):
        return False
    if path.suffix == ".traj":
        return bool(_SWE_KEYS.search(head))
    return bool(_STEP_START.search(head))  # renamed: a trajectory list whose entries start with "action"


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    loc = Location(path)
    doc = load_json_document(path)
    if not isinstance(doc, dict):
        raise loc.invalid(None, "a .traj file must hold a JSON object")
    if "trajectory" not in doc and "history" not in doc:
        raise loc.invalid("trajectory", "missing")
    trajectory = optional(doc, "trajectory", list, loc) or []
    history = optional(doc, "history", list, loc) or []
    for index, entry in enumerate(trajectory):
        if not isinstance(entry, dict):
            raise loc.invalid(f"trajectory[{index}]", "must be an object")
    for index, message in enumerate(history):
        if not isinstance(message, dict):
            raise loc.invalid(f"history[{index}]", "must be an object")
    yield _record(path, name, doc, trajectory, _primary(history), loc)


def _record(
    path: Path,
    name: str | None,
    doc: dict[str, Any],
    trajectory: list[dict],
    history: list[dict],
    loc: Location,
) -> TrajectoryRecord:
    info = optional(doc, "info", dict, loc) or {}
    replay = _replay_config(doc)
    problem = as_dict(replay.get("problem_statement"))
    stats = as_dict(info.get("model_stats"))
    submission = text_or_empty(info.get("submission"))
    steps = _opening_messages(history)
    steps += _steps_from_trajectory(trajectory, history) if trajectory else _steps_from_history(history)
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=str(info.get("swe_agent_version") or ""),
        source_ref=f"swe-agent:{ref_name(path, name)}",
        task_key=str(problem.get("id") or path.name.removesuffix(".json").removesuffix(".traj")),
        instruction=_instruction(problem, history),
        harness="swe-agent",
        model=str(as_dict(as_dict(replay.get("agent")).get("model")).get("name") or ""),
        cost=number_or_none(stats.get("instance_cost")),
        final_diff=submission if looks_like_diff(submission) else "",
        metadata=_metadata(path, info, stats, submission, doc),
        steps=steps,
    )


def _replay_config(doc: dict[str, Any]) -> dict[str, Any]:
    replay = doc.get("replay_config")
    if isinstance(replay, str):  # some SWE-agent versions store it as JSON text
        try:
            replay = loads_json(replay)
        except ValueError:
            return {}
    return as_dict(replay)


def _primary(history: list[dict]) -> list[dict]:
    """Only the main agent's messages: other agents (the reviewer, the summariser) have their own turns."""
    return [m for m in history if m.get("agent") in (None, "primary", "main")]


def _opening_messages(history: list[dict]) -> list[StepRecord]:
    steps = []
    for message in history:
        if message.get("role") == "assistant" and not _is_demo(message):
            break
        payload = {"is_demo": True} if _is_demo(message) else {}
        steps.append(
            message_step(
                str(message.get("role") or "user"), content_text(message.get("content")), payload=payload
            )
        )
    return steps


def _is_demo(message: dict[str, Any]) -> bool:
    return str(message.get("is_demo", "")).lower() == "true"


def _steps_from_trajectory(trajectory: list[dict], history: list[dict]) -> list[StepRecord]:
    steps: list[StepRecord] = []
    converted = [message_record(m) for m in history]  # shared by every step's context, not copied
    cursor = 0
    for index, entry in enumerate(trajectory):
        match = _find_assistant(history, entry.get("action"), cursor)
        if match is not None:
            cursor = match + 1
        context = _saved_context(entry)
        if context is None and match is not None:
            context = converted[:match]
        tool_calls = normalise_tool_calls(history[match].get("tool_calls")) if match is not None else None
        steps.append(_model_call(entry, index, context, tool_calls))
        steps.append(_command(entry, index))
    return steps


def _find_assistant(history: list[dict], action: Any, start: int) -> int | None:
    """The next assistant message that issued `action`; None when the history lost it (a requery)."""
    wanted = str(action or "").strip()
    for index in range(start, len(history)):
        message = history[index]
        if message.get("role") == "assistant" and not _is_demo(message):
            if str(message.get("action") or "").strip() == wanted:
                return index
    return None


def _saved_context(entry: dict[str, Any]) -> list[MessageRecord] | None:
    for key in ("query", "messages"):
        messages = entry.get(key)
        if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
            return [message_record(m) for m in messages]
    return None


def _model_call(
    entry: dict[str, Any], index: int, context: list[MessageRecord] | None, tool_calls: list | None
) -> StepRecord:
    return StepRecord(
        kind="model_call",
        text=content_text(entry.get("thought")),
        response_text=content_text(entry.get("response")),
        request_messages=context,
        tool_calls=tool_calls,
        payload={"trajectory_index": index},
    )


def _command(entry: dict[str, Any], index: int) -> StepRecord:
    payload: dict[str, Any] = {"trajectory_index": index}
    state = _state(entry.get("state"))
    if state:
        payload["state"] = state
    return StepRecord(
        kind="command",
        command=content_text(entry.get("action")),
        output=content_text(entry.get("observation")),
        duration_ms=seconds_to_ms(entry.get("execution_time")),
        payload=payload,
    )


def _state(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = loads_json(value)
        except ValueError:
            return {"raw": value}
    return as_dict(value)


def _steps_from_history(history: list[dict]) -> list[StepRecord]:
    """Demonstration files keep only the chat: assistant turns carry `action`, the next turn its result."""
    start = next(
        (i for i, m in enumerate(history) if m.get("role") == "assistant" and not _is_demo(m)), len(history)
    )
    steps: list[StepRecord] = []
    converted = [message_record(m) for m in history]
    index = start
    while index < len(history):
        message = history[index]
        if message.get("role") != "assistant":
            steps.append(
                message_step(str(message.get("role") or "user"), content_text(message.get("content")))
            )
            index += 1
            continue
        steps.append(
            StepRecord(
                kind="model_call",
                text=content_text(message.get("thought")),
                response_text=content_text(message.get("content")),
                request_messages=converted[:index],
                tool_calls=normalise_tool_calls(message.get("tool_calls")),
                payload={"history_index": index},
            )
        )
        answer = history[index + 1] if index + 1 < len(history) else None
        answered = answer is not None and answer.get("role") in ("tool", "user")
        steps.append(
            StepRecord(
                kind="command",
                command=content_text(message.get("action")),
                output=content_text(answer.get("content")) if answered and answer else None,
                payload={"history_index": index},
            )
        )
        index += 2 if answered else 1
    return steps


def _instruction(problem: dict[str, Any], history: list[dict]) -> str:
    if isinstance(problem.get("text"), str) and problem["text"]:
        return problem["text"]
    for message in history:
        if message.get("role") == "user" and not _is_demo(message):
            return content_text(message.get("content"))
    return ""


def _metadata(
    path: Path, info: dict[str, Any], stats: dict[str, Any], submission: str, doc: dict[str, Any]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "run_name": path.parent.name,
        "exit_status": info.get("exit_status"),
        "submission": submission,
        "model_stats": stats,
        "usage": {
            "tokens_in": count_or_none(stats.get("tokens_sent")),
            "tokens_out": count_or_none(stats.get("tokens_received")),
            "api_calls": count_or_none(stats.get("api_calls")),
        },
    }
    if isinstance(doc.get("environment"), str):
        metadata["environment"] = doc["environment"]
    for key in ("swe_agent_version", "swe_agent_hash", "swe_rex_version"):
        if info.get(key):
            metadata[key] = info[key]
    if info.get("swe_agent_version"):
        metadata["agent_version"] = info["swe_agent_version"]
    return metadata
