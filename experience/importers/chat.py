"""OpenAI-style chat messages (with tool calls) to steps. Used by the importers whose source is a message list.

A conversation becomes: leading and later system / user turns as `message` steps; each assistant message
as a `model_call` whose request context is every message before it; then, per tool call, a `command`
(shell tools, with the tool message as its output) or a `tool_call` followed by an `observation`
holding the tool's answer. Tool messages that answer no call become `observation` steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experience.importers.base import (
    Location,
    content_text,
    message_record,
    message_step,
    normalise_tool_calls,
    reasoning_text,
    shell_command,
    side_reasoning,
    tool_call_parts,
)
from experience.records import MessageRecord, StepRecord


@dataclass
class _Turn:
    """An assistant message and the tool messages that answered it."""

    call: StepRecord
    results: list[dict[str, Any]] = field(default_factory=list)


def steps_from_chat(messages: list[Any], loc: Location, *, prefix: str = "messages") -> list[StepRecord]:
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise loc.invalid(f"{prefix}[{index}]", "must be an object")
    context = [message_record(m) for m in messages]
    steps: list[StepRecord] = []
    turn: _Turn | None = None
    for index, message in enumerate(messages):
        role = str(message.get("role") or "")
        if role == "assistant":
            _flush(turn, steps)
            turn = _Turn(call=_model_call(message, context[:index]))
        elif role == "tool" and turn is not None:
            turn.results.append(message)
        else:
            _flush(turn, steps)
            turn = None
            steps.append(_lone_message(role, message))
    _flush(turn, steps)
    return steps


def _model_call(message: dict[str, Any], context: list[MessageRecord]) -> StepRecord:
    return StepRecord(
        kind="model_call",
        request_messages=context,
        response_text=content_text(message.get("content")),
        text=reasoning_text(message.get("content")) or side_reasoning(message),
        tool_calls=normalise_tool_calls(message.get("tool_calls")),
        model=message.get("model") if isinstance(message.get("model"), str) else None,
    )


def _lone_message(role: str, message: dict[str, Any]) -> StepRecord:
    text = content_text(message.get("content"))
    if role == "tool":  # a tool answer with no assistant call before it
        return StepRecord(kind="observation", text=text, payload=_tool_payload(message.get("tool_call_id")))
    return message_step(role or "user", text)


def _flush(turn: _Turn | None, steps: list[StepRecord]) -> None:
    if turn is None:
        return
    steps.append(turn.call)
    by_id = {r.get("tool_call_id"): r for r in turn.results if r.get("tool_call_id")}
    unmatched = [r for r in turn.results if not r.get("tool_call_id")]
    for call in turn.call.tool_calls or []:
        call_id, name, arguments = tool_call_parts(call)
        result = by_id.pop(call_id, None) if call_id else (unmatched.pop(0) if unmatched else None)
        steps.extend(_action_steps(call, call_id, name, arguments, result))
    for result in [*by_id.values(), *unmatched]:
        steps.append(
            StepRecord(
                kind="observation",
                text=content_text(result.get("content")),
                payload=_tool_payload(result.get("tool_call_id")),
            )
        )


def _action_steps(
    call: dict[str, Any], call_id: str | None, name: str, arguments: Any, result: dict[str, Any] | None
) -> list[StepRecord]:
    output = content_text(result.get("content")) if result is not None else None
    command = shell_command(name, arguments)
    if command is not None:
        return [
            StepRecord(
                kind="command",
                command=command,
                output=output,
                payload={"tool": name, **_tool_payload(call_id)},
            )
        ]
    steps = [
        StepRecord(kind="tool_call", tool_calls=[call], payload={"tool": name, **_tool_payload(call_id)})
    ]
    if result is not None:
        steps.append(StepRecord(kind="observation", text=output or "", payload=_tool_payload(call_id)))
    return steps


def _tool_payload(call_id: Any) -> dict[str, Any]:
    return {"tool_call_id": call_id} if isinstance(call_id, str) and call_id else {}
