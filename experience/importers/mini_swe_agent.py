"""mini-swe-agent trajectory files (`*.traj.json`, one run per file).

Shape (save_traj / Agent.save): {"info": {exit_status, submission, model_stats: {instance_cost, api_calls},
mini_version, config: {agent, model, environment, ...}}, "messages": [...], "trajectory_format":
"mini-swe-agent-1" | "mini-swe-agent-1.1", "instance_id"? (the SWE-bench runner adds it)}.

In format 1 an assistant message is {"role", "content", "extra": {"response": <litellm response>}} and the
command is the single ```bash block in its content; the next user message renders the result as
"<returncode>N</returncode>\\n<output>\\n...\\n</output>". In format 1.1 (mini-swe-agent 2) the assistant
message carries extra.actions [{command, tool_call_id?}], extra.cost and extra.timestamp, observations
(role user or tool) carry extra.raw_output / returncode / timestamp, and a final role "exit" message holds
the exit status.

Steps: opening system / user messages -> `message`; assistant -> `model_call` (context = messages before
it, tokens and model from the saved response) then one `command` per action with its output and exit code;
other user / tool messages (format errors) -> `observation`; the exit message -> `note`. A timeout
("The last command <command>...</command> timed out and has been killed", format 1) answers its command:
the command gets the output shown, is_error, no exit code, and the whole message in
payload["timeout_message"].
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    as_list,
    content_text,
    count_or_none,
    load_json_document,
    looks_like_diff,
    message_record,
    message_step,
    normalise_tool_calls,
    number_or_none,
    parse_time,
    read_tail,
    ref_name,
    require,
    side_reasoning,
    sum_counts,
    text_or_empty,
    unique_call_ids,
)
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT = "mini_swe_agent"
SOURCE_FORMAT = "mini-swe-agent-traj"
_MARKER = re.compile(rb'"trajectory_format"\s*:\s*"mini-swe-agent')
_BASH_BLOCK = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
_RETURNCODE = re.compile(r"^\s*(?:<exception>.*?</exception>\s*)?<returncode>(-?\d+)</returncode>", re.DOTALL)
_OUTPUT = re.compile(r"<output>\n?(.*?)\n?</output>", re.DOTALL)
# mini-swe-agent's timeout_template: "The last command <command>...</command> timed out and has been killed."
_TIMEOUT = re.compile(r"^\s*The last command <command>.*?</command> timed out and has been killed", re.DOTALL)


def detect(path: Path, head: bytes) -> bool:
    # save_traj writes trajectory_format last, so on a long run the marker is only in the tail
    return head.lstrip().startswith(b"{") and bool(_MARKER.search(head) or _MARKER.search(read_tail(path)))


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    loc = Location(path)
    doc = load_json_document(path)
    if not isinstance(doc, dict):
        raise loc.invalid(None, "a mini-swe-agent trajectory must be a JSON object")
    messages = require(doc, "messages", list, loc)
    fmt = require(doc, "trajectory_format", str, loc)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise loc.invalid(f"messages[{index}]", "must be an object")
    info = as_dict(doc.get("info"))
    yield _record(path, name, doc, fmt, info, messages, loc)


def _record(
    path: Path, name: str | None, doc: dict, fmt: str, info: dict, messages: list[dict], loc: Location
) -> TrajectoryRecord:
    steps = unique_call_ids(_steps(messages, loc))
    stats = as_dict(info.get("model_stats"))
    submission = text_or_empty(info.get("submission"))
    times = [t for s in steps for t in (s.started_at, s.ended_at) if t]
    instance = doc.get("instance_id") or info.get("instance_id")
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=fmt,
        source_ref=f"mini-swe-agent:{ref_name(path, name)}",
        task_key=str(instance or path.name.removesuffix(".json").removesuffix(".traj")),
        instruction=_instruction(messages),
        harness="mini-swe-agent",
        model=str(as_dict(as_dict(info.get("config")).get("model")).get("model_name") or ""),
        cost=number_or_none(stats.get("instance_cost")),
        started_at=min(times) if times else None,
        finished_at=max(times) if times else None,
        final_diff=submission if looks_like_diff(submission) else "",
        metadata=_metadata(info, stats, submission, steps),
        steps=steps,
    )


def _steps(messages: list[dict], loc: Location) -> list[StepRecord]:
    steps: list[StepRecord] = []
    pending: list[tuple[str | None, StepRecord]] = []  # commands of the last assistant turn awaiting output
    opening = True
    context = [message_record(m) for m in messages]  # shared by every call's context, not copied
    for index, message in enumerate(messages):
        role = str(message.get("role") or "")
        extra = as_dict(message.get("extra"))
        if role == "assistant":
            opening = False
            call = _model_call(message, extra, context[:index], loc, index)
            commands = [_command(action, call) for action in _actions(message, extra)]
            steps.append(call)
            steps.extend(step for _, step in commands)
            pending = commands
        elif role == "exit":
            steps.append(
                StepRecord(
                    kind="note",
                    text=content_text(message.get("content")),
                    payload={"exit_status": extra.get("exit_status")},
                )
            )
        elif opening and role in ("system", "user"):
            steps.append(message_step(role, content_text(message.get("content"))))
        elif pending and _is_result(message, extra):
            _fill_output(_take(pending, message.get("tool_call_id")), message, extra, loc, index)
        else:
            steps.append(_observation(message, extra, loc, index))
    return steps


def _model_call(
    message: dict, extra: dict, context: list[MessageRecord], loc: Location, index: int
) -> StepRecord:
    response = as_dict(extra.get("response"))
    usage = as_dict(response.get("usage"))
    ended = parse_time(extra.get("timestamp"), loc, f"messages[{index}].extra.timestamp")
    payload: dict[str, Any] = {"message_index": index}
    if number_or_none(extra.get("cost")) is not None:
        payload["cost"] = extra["cost"]
    return StepRecord(
        kind="model_call",
        request_messages=context,
        response_text=content_text(message.get("content")),
        # the thought a provider returns beside the content (Gemini's, ...): format 1.1 saves the provider's
        # message whole; format 1 saves only its content, the message being in the saved response
        text=side_reasoning(message) or side_reasoning(_response_message(response)),
        tool_calls=normalise_tool_calls(message.get("tool_calls")),
        model=response.get("model") if isinstance(response.get("model"), str) else None,
        tokens_in=count_or_none(usage.get("prompt_tokens", usage.get("input_tokens"))),
        tokens_out=count_or_none(usage.get("completion_tokens", usage.get("output_tokens"))),
        call_id=response.get("id") if isinstance(response.get("id"), str) else None,
        ended_at=ended,
        response_json=response or None,
        payload=payload,
    )


def _response_message(response: dict) -> dict:
    choices = as_list(response.get("choices"))
    return as_dict(as_dict(choices[0]).get("message")) if choices else {}


def _actions(message: dict, extra: dict) -> list[dict[str, Any]]:
    if "actions" in extra:  # format 1.1 records what it parsed
        return [a for a in as_list(extra.get("actions")) if isinstance(a, dict) and "command" in a]
    blocks = _BASH_BLOCK.findall(content_text(message.get("content")))
    # format 1 runs exactly one block; any other count was a format error and ran nothing
    return [{"command": blocks[0].strip()}] if len(blocks) == 1 else []


def _command(action: dict[str, Any], call: StepRecord) -> tuple[str | None, StepRecord]:
    call_id = action.get("tool_call_id") if isinstance(action.get("tool_call_id"), str) else None
    payload = {"tool_call_id": call_id} if call_id else {}
    step = StepRecord(
        kind="command", command=str(action.get("command") or ""), started_at=call.ended_at, payload=payload
    )
    return call_id, step


def _is_result(message: dict, extra: dict) -> bool:
    if "returncode" in extra or "raw_output" in extra:
        return True
    content = content_text(message.get("content"))
    return bool(_RETURNCODE.match(content) or _TIMEOUT.match(content))


def _take(pending: list[tuple[str | None, StepRecord]], call_id: Any) -> StepRecord:
    for index, (pending_id, _) in enumerate(pending):
        if call_id and pending_id == call_id:
            return pending.pop(index)[1]
    return pending.pop(0)[1]


def _fill_output(step: StepRecord, message: dict, extra: dict, loc: Location, index: int) -> None:
    content = content_text(message.get("content"))
    if "raw_output" in extra or "returncode" in extra:
        step.output = str(extra.get("raw_output") or "")
        step.exit_code = extra.get("returncode") if isinstance(extra.get("returncode"), int) else None
    else:
        code = _RETURNCODE.match(content)
        output = _OUTPUT.search(content)
        step.exit_code = int(code.group(1)) if code else None
        step.output = output.group(1) if output else content
        if code is None and _TIMEOUT.match(content):  # killed: no exit code; the message stays with it
            step.is_error = True
            step.payload["timeout_message"] = content
    if extra.get("exception_info"):
        step.is_error = True
        step.payload["exception_info"] = extra["exception_info"]
    step.ended_at = parse_time(extra.get("timestamp"), loc, f"messages[{index}].extra.timestamp")
    if step.started_at and step.ended_at and step.ended_at < step.started_at:
        step.started_at = None


def _observation(message: dict, extra: dict, loc: Location, index: int) -> StepRecord:
    payload: dict[str, Any] = {"role": str(message.get("role") or "")}
    if extra.get("interrupt_type"):
        payload["interrupt_type"] = extra["interrupt_type"]
    return StepRecord(
        kind="observation",
        text=content_text(message.get("content")),
        is_error=bool(extra.get("interrupt_type") or extra.get("exception_info")),
        ended_at=parse_time(extra.get("timestamp"), loc, f"messages[{index}].extra.timestamp"),
        payload=payload,
    )


def _instruction(messages: list[dict]) -> str:
    for message in messages:
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _metadata(info: dict, stats: dict, submission: str, steps: list[StepRecord]) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "exit_status": info.get("exit_status"),
        "submission": submission,
        "model_stats": stats,
        "usage": {
            "tokens_in": sum_counts([s.tokens_in for s in steps]),
            "tokens_out": sum_counts([s.tokens_out for s in steps]),
            "api_calls": count_or_none(stats.get("api_calls")),
        },
    }
    if info.get("mini_version"):
        metadata["agent_version"] = metadata["mini_version"] = info["mini_version"]
    return metadata
