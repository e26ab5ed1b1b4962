"""ATIF, the Agent Trajectory Interchange Format (Harbor / terminal-bench), schema ATIF-v1.x.

A file holds one document {"schema_version": "ATIF-v1.x", "session_id", "agent": {name, version,
model_name?}, "steps": [...], "notes"?, "final_metrics"?, "extra"?}, a JSON list of them, or JSONL with
one per line. A step: {"step_id", "timestamp"?, "source": "system" | "user" | "agent", "message",
"reasoning_content"?, "model_name"?, "tool_calls"?: [{tool_call_id, function_name, arguments}],
"observation"?: {"results": [{source_call_id?, content}]}, "metrics"?: {prompt_tokens, completion_tokens,
cached_tokens?, cost_usd?}, "extra"?}.

Steps: system / user steps -> `message`; an agent step -> `model_call` (message as the reply, reasoning,
metrics), then per tool call a `command` (shell tools, output from the matching result) or a `tool_call`
followed by an `observation` with its result; results tied to no call -> `observation`. Where Trove wrote
the file, `extra["trove"]` restores the exact step kinds, exit codes and the run's own fields.
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
    first_json_line,
    iter_jsonl,
    load_json_document,
    message_step,
    number_or_none,
    openai_tool_call,
    optional,
    parse_time,
    read_head,
    require,
    shell_command,
)
from experience.records import StepRecord, TrajectoryRecord

FORMAT = "atif"
SOURCE_FORMAT = "atif"
HINT_KEY = "trove"  # extra["trove"]: what Trove's exporter records beyond the ATIF schema
OBSERVATION_LIKE = frozenset({"observation", "file_change", "eval", "note", "sandbox_event"})
_MARKER = re.compile(rb'"schema_version"\s*:\s*"ATIF-v')
_SOURCES = ("system", "user", "agent")


def detect(path: Path, head: bytes) -> bool:
    start = head.lstrip()[:1]
    return start in (b"{", b"[") and bool(_MARKER.search(head[:65536]))


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    line = first_json_line(read_head(path))
    if isinstance(line, dict) and "schema_version" in line:  # JSONL, one document per line
        for index, (number, document) in enumerate(iter_jsonl(path)):
            yield _record(document, Location(path, line=number, record=index))
        return
    document = load_json_document(path)
    documents = document if isinstance(document, list) else [document]
    for index, item in enumerate(documents):
        yield _record(item, Location(path, record=index if isinstance(document, list) else None))


def _record(document: Any, loc: Location) -> TrajectoryRecord:
    if not isinstance(document, dict):
        raise loc.invalid(None, "an ATIF trajectory must be a JSON object")
    version = require(document, "schema_version", str, loc)
    if not version.startswith("ATIF-"):
        raise loc.invalid("schema_version", f"{version!r} is not an ATIF version")
    session = require(document, "session_id", str, loc)
    agent = require(document, "agent", dict, loc)
    require(agent, "name", str, loc, prefix="agent.")
    raw_steps = require(document, "steps", list, loc)
    steps: list[StepRecord] = []
    for index, raw in enumerate(raw_steps):
        steps += _steps(raw, loc, f"steps[{index}]")
    extra = as_dict(document.get("extra"))
    run = as_dict(extra.get(HINT_KEY))
    metrics = as_dict(document.get("final_metrics"))
    times = [t for s in steps for t in (s.started_at, s.ended_at) if t]
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=version,
        source_ref=str(run.get("source_ref") or f"atif:{session}"),
        task_key=str(run.get("task_key") or extra.get("task_id") or extra.get("task_name") or session),
        instruction=str(run.get("instruction") or _first_user(steps)),
        task_set=str(run.get("task_set") or ""),
        harness=str(run.get("harness") or agent["name"]),
        model=str(agent.get("model_name") or run.get("model") or ""),
        reward=number_or_none(run.get("reward", extra.get("reward"))),
        success=_bool(run.get("success", extra.get("success"))),
        cost=number_or_none(metrics.get("total_cost_usd")),
        started_at=parse_time(run.get("started_at"), loc, "extra.trove.started_at")
        or (min(times) if times else None),
        finished_at=parse_time(run.get("finished_at"), loc, "extra.trove.finished_at")
        or (max(times) if times else None),
        final_diff=str(run.get("final_diff") or ""),
        metadata=_metadata(document, agent, run, metrics),
        steps=steps,
    )


def _metadata(document: dict, agent: dict, run: dict, metrics: dict) -> dict[str, Any]:
    metadata = dict(as_dict(run.get("metadata")))
    metadata["atif"] = {"session_id": document.get("session_id"), "agent": agent, "final_metrics": metrics}
    metadata.setdefault(
        "usage",
        {
            "tokens_in": count_or_none(metrics.get("total_prompt_tokens")),
            "tokens_out": count_or_none(metrics.get("total_completion_tokens")),
            "api_calls": None,
        },
    )
    if document.get("notes"):
        metadata["atif"]["notes"] = document["notes"]
    if agent.get("version") and "agent_version" not in metadata:
        metadata["agent_version"] = agent["version"]
    return metadata


def _steps(raw: Any, loc: Location, where: str) -> list[StepRecord]:
    if not isinstance(raw, dict):
        raise loc.invalid(where, "must be an object")
    source = require(raw, "source", str, loc, prefix=where + ".")
    if source not in _SOURCES:
        raise loc.invalid(where + ".source", f"{source!r} is not one of system, user, agent")
    moment = parse_time(raw.get("timestamp"), loc, where + ".timestamp")
    hint = as_dict(as_dict(raw.get("extra")).get(HINT_KEY))
    calls = optional(raw, "tool_calls", list, loc, prefix=where + ".") or []
    steps: list[StepRecord] = []
    if not hint.get("continuation"):
        steps.append(
            _agent_call(raw, calls, moment)
            if source == "agent"
            else message_step(source, content_text(raw.get("message")), started_at=moment)
        )
    results = [r for r in as_list(as_dict(raw.get("observation")).get("results")) if isinstance(r, dict)]
    # Trove marks a reply's tool calls that did not run as steps of their own (e.g. OpenHands "think")
    actions = [] if hint.get("calls_not_steps") else calls
    steps += _actions(actions, results, as_dict(hint.get("exit_codes")), loc, where)
    kinds = hint.get("kinds")
    if isinstance(kinds, list) and len(kinds) == len(steps):
        steps = [_relabel(step, str(kind)) for step, kind in zip(steps, kinds, strict=True)]
    return steps


def _agent_call(raw: dict[str, Any], calls: list[Any], moment: Any) -> StepRecord:
    metrics = as_dict(raw.get("metrics"))
    payload: dict[str, Any] = {}
    for key in ("cost_usd", "cached_tokens"):
        if metrics.get(key) is not None:
            payload[key] = metrics[key]
    if raw.get("reasoning_effort") is not None:
        payload["reasoning_effort"] = raw["reasoning_effort"]
    latency = as_dict(metrics.get("extra")).get("latency_ms")
    return StepRecord(
        kind="model_call",
        response_text=content_text(raw.get("message")),
        text=content_text(raw.get("reasoning_content")),
        model=raw.get("model_name") if isinstance(raw.get("model_name"), str) else None,
        tool_calls=[_openai(c) for c in calls if isinstance(c, dict)] or None,
        tokens_in=count_or_none(metrics.get("prompt_tokens")),
        tokens_out=count_or_none(metrics.get("completion_tokens")),
        latency_ms=number_or_none(latency),
        started_at=moment,
        payload=payload,
    )


def _actions(
    calls: list[Any], results: list[dict[str, Any]], exit_codes: dict[str, Any], loc: Location, where: str
) -> list[StepRecord]:
    by_id: dict[str, dict[str, Any]] = {}
    loose: list[dict[str, Any]] = []
    for result in results:
        source = result.get("source_call_id")
        if isinstance(source, str) and source and source not in by_id:
            by_id[source] = result
        else:
            loose.append(result)
    steps: list[StepRecord] = []
    for index, call in enumerate(calls):
        prefix = f"{where}.tool_calls[{index}]."
        call_id = require(call, "tool_call_id", str, loc, prefix=prefix)
        name = require(call, "function_name", str, loc, prefix=prefix)
        answer = by_id.pop(call_id, None)
        steps += _action(call_id, name, as_dict(call.get("arguments")), answer, exit_codes.get(call_id))
    for leftover in [*by_id.values(), *loose]:
        steps.append(
            StepRecord(kind="observation", text=_result_text(leftover), payload=_call_payload(leftover))
        )
    return steps


def _action(
    call_id: str, name: str, arguments: dict[str, Any], result: dict[str, Any] | None, exit_code: Any
) -> list[StepRecord]:
    payload = {"tool": name, "tool_call_id": call_id}
    command = shell_command(name, arguments)
    if command is not None:
        code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
        output = _result_text(result) if result is not None else None
        return [StepRecord(kind="command", command=command, output=output, exit_code=code, payload=payload)]
    steps = [
        StepRecord(kind="tool_call", tool_calls=[openai_tool_call(call_id, name, arguments)], payload=payload)
    ]
    if result is not None:
        steps.append(
            StepRecord(kind="observation", text=_result_text(result), payload={"tool_call_id": call_id})
        )
    return steps


def _relabel(step: StepRecord, kind: str) -> StepRecord:
    """Give a derived step the kind Trove exported it from, where the two are compatible."""
    if kind == step.kind:
        return step
    if step.kind == "model_call" and kind == "message":
        return message_step("assistant", step.response_text or "", started_at=step.started_at)
    if step.kind == "observation" and kind in OBSERVATION_LIKE:
        step.kind = kind
    elif step.kind == "observation" and kind == "message":
        return message_step("tool", step.text, payload=step.payload)
    return step


def _openai(call: dict[str, Any]) -> dict[str, Any]:
    return openai_tool_call(
        call.get("tool_call_id"), call.get("function_name"), as_dict(call.get("arguments"))
    )


def _result_text(result: dict[str, Any]) -> str:
    if "content" in result:
        return content_text(result.get("content"))
    refs = as_list(result.get("subagent_trajectory_ref"))
    return "subagent: " + ", ".join(str(as_dict(r).get("session_id")) for r in refs) if refs else ""


def _call_payload(result: dict[str, Any]) -> dict[str, Any]:
    call_id = result.get("source_call_id")
    return {"tool_call_id": call_id} if isinstance(call_id, str) and call_id else {}


def _first_user(steps: list[StepRecord]) -> str:
    for step in steps:
        if step.kind == "message" and step.payload.get("role") == "user":
            return step.text
    return ""


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
