"""ATIF, the Agent Trajectory Interchange Format (Harbor / terminal-bench), schema ATIF-v1.0 to v1.7.

A file holds one document {"schema_version": "ATIF-v1.x", "session_id" (optional from v1.7),
"trajectory_id"? (v1.7), "agent": {name, version, model_name?}, "steps": [...], "notes"?, "final_metrics"?,
"extra"?, "subagent_trajectories"? (v1.7)}, a JSON list of them, or JSONL with one per line. A step:
{"step_id", "timestamp"?, "source": "system" | "user" | "agent", "message" (text or content parts),
"reasoning_content"?, "model_name"?, "tool_calls"?: [{tool_call_id, function_name, arguments, extra?}],
"observation"?: {"results": [{source_call_id?, content?, subagent_trajectory_ref?, extra?}]},
"metrics"?: {prompt_tokens, completion_tokens, cached_tokens?, cost_usd?, prompt_token_ids?,
completion_token_ids?, logprobs?}, "llm_call_count"? (v1.7), "is_copied_context"?, "extra"?}.

Steps: system / user steps -> `message`; an agent step -> `model_call` (message as the reply, reasoning,
metrics; token ids and logprobs in the payload where the proxy keeps them: `prompt_token_ids`, `token_ids`,
`logprobs`, so RL samples assemble from an imported run), then per tool call a `command` (shell tools,
output from the matching result) or a `tool_call` followed by an `observation` with its result; results
tied to no call -> `observation`. An agent step with llm_call_count 0 made no model call (a deterministic
dispatch): it gives no `model_call`, only its message (if any) and its actions; a count above 1 is kept in
the call's payload. Where Trove wrote the file, `extra["trove"]` restores the exact step kinds, exit codes
and the run's own fields.

Subagents: each trajectory embedded in `subagent_trajectories` (v1.7) is a run of its own, source_ref
"<parent's ref>/<its trajectory_id>"; so is a subagent file a result names by `trajectory_path` (read from
beside the file, when present). The parent lists them in metadata["subagent_source_refs"], each names its
parent in metadata["parent_source_ref"], and the step of the result that delegated to it names it in
payload["subagent_source_ref"]. A parent's records come first, then its subagents'.
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
            yield from document_records(document, Location(path, line=number, record=index))
        return
    document = load_json_document(path)
    documents = document if isinstance(document, list) else [document]
    for index, item in enumerate(documents):
        yield from document_records(item, Location(path, record=index if isinstance(document, list) else None))


def document_records(
    document: Any, loc: Location, *, ref: str | None = None, seen: frozenset[Path] = frozenset()
) -> list[TrajectoryRecord]:
    """The runs of one ATIF document: its own first (source_ref `ref` when given), then its subagents'.
    `seen`: the files being read up the chain, so subagent files that name each other are read once."""
    if not isinstance(document, dict):
        raise loc.invalid(None, "an ATIF trajectory must be a JSON object")
    run = as_dict(as_dict(document.get("extra")).get(HINT_KEY))
    own_ref = ref or str(run.get("source_ref") or f"atif:{_identity(document, loc)}")
    children = _subagents(document, loc, own_ref, seen | {loc.path.resolve()})
    links = {key: child[0].source_ref for key, child in children.items()}
    root = _record(document, loc, own_ref, links)
    if links:
        root.metadata["subagent_source_refs"] = list(dict.fromkeys(links.values()))
    records = [root]
    for child in children.values():
        child[0].metadata["parent_source_ref"] = own_ref
        records += child
    return records


def _identity(document: dict[str, Any], loc: Location) -> str:
    """session_id (required up to v1.6), else v1.7's trajectory_id."""
    session = optional(document, "session_id", str, loc)
    trajectory = optional(document, "trajectory_id", str, loc)
    if not (session or trajectory):
        raise loc.invalid("session_id", "missing (and no trajectory_id names the trajectory)")
    return session or trajectory


def _subagents(
    document: dict[str, Any], loc: Location, parent_ref: str, seen: frozenset[Path]
) -> dict[str, list[TrajectoryRecord]]:
    """The subagent runs a document embeds (by trajectory_id) or names by file (by trajectory_path), keyed so
    a result's subagent_trajectory_ref finds its run."""
    found: dict[str, list[TrajectoryRecord]] = {}
    for index, child in enumerate(optional(document, "subagent_trajectories", list, loc) or []):
        where = f"subagent_trajectories[{index}]"
        key = require(child, "trajectory_id", str, loc, prefix=where + ".")
        if key in found:
            raise loc.invalid(where + ".trajectory_id", f"{key!r} is repeated (it must be unique)")
        found[key] = document_records(child, loc, ref=f"{parent_ref}/{key}", seen=seen)
    for reference in _references(document):
        path = reference.get("trajectory_path")
        if isinstance(path, str) and path and path not in found:
            child_loc = _beside(loc.path, path)
            if child_loc is not None and child_loc.path.resolve() not in seen:
                found[path] = document_records(load_json_document(child_loc.path), child_loc,
                                               ref=f"{parent_ref}/{path}", seen=seen)
    return found


def _references(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for step in as_list(document.get("steps")):
        for result in as_list(as_dict(as_dict(step).get("observation")).get("results")):
            yield from (r for r in as_list(as_dict(result).get("subagent_trajectory_ref")) if isinstance(r, dict))


def _beside(path: Path, relative: str) -> Location | None:
    """A subagent file named relative to the file that names it, when it is there. A name that leaves the
    folder (absolute, or through ..) is not followed: a file must not make the importer read elsewhere."""
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        return None
    target = path.parent / candidate
    if not target.is_file() or not target.resolve().is_relative_to(path.parent.resolve()):  # nor a symlink out
        return None
    return Location(target)


def _record(document: dict[str, Any], loc: Location, ref: str, links: dict[str, str]) -> TrajectoryRecord:
    version = require(document, "schema_version", str, loc)
    if not version.startswith("ATIF-"):
        raise loc.invalid("schema_version", f"{version!r} is not an ATIF version")
    agent = require(document, "agent", dict, loc)
    require(agent, "name", str, loc, prefix="agent.")
    raw_steps = require(document, "steps", list, loc)
    steps: list[StepRecord] = []
    for index, raw in enumerate(raw_steps):
        steps += _steps(raw, loc, f"steps[{index}]", links)
    extra = as_dict(document.get("extra"))
    run = as_dict(extra.get(HINT_KEY))
    metrics = as_dict(document.get("final_metrics"))
    times = [t for s in steps for t in (s.started_at, s.ended_at) if t]
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=version,
        source_ref=ref,
        task_key=str(run.get("task_key") or extra.get("task_id") or extra.get("task_name") or ref.removeprefix("atif:")),
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
    for key in ("trajectory_id", "continued_trajectory_ref", "notes"):
        if document.get(key):
            metadata["atif"][key] = document[key]
    metadata.setdefault(
        "usage",
        {
            "tokens_in": count_or_none(metrics.get("total_prompt_tokens")),
            "tokens_out": count_or_none(metrics.get("total_completion_tokens")),
            "api_calls": None,
        },
    )
    if agent.get("version") and "agent_version" not in metadata:
        metadata["agent_version"] = agent["version"]
    return metadata


def _steps(raw: Any, loc: Location, where: str, links: dict[str, str]) -> list[StepRecord]:
    if not isinstance(raw, dict):
        raise loc.invalid(where, "must be an object")
    source = require(raw, "source", str, loc, prefix=where + ".")
    if source not in _SOURCES:
        raise loc.invalid(where + ".source", f"{source!r} is not one of system, user, agent")
    moment = parse_time(raw.get("timestamp"), loc, where + ".timestamp")
    hint = as_dict(as_dict(raw.get("extra")).get(HINT_KEY))
    calls = optional(raw, "tool_calls", list, loc, prefix=where + ".") or []
    llm_calls = optional(raw, "llm_call_count", int, loc, prefix=where + ".")
    if llm_calls is not None and llm_calls < 0:
        raise loc.invalid(where + ".llm_call_count", f"must be 0 or more, got {llm_calls}")
    steps: list[StepRecord] = []
    if hint.get("continuation"):
        pass
    elif source == "agent" and llm_calls == 0:  # a deterministic dispatch: no model call to record
        if content_text(raw.get("message")):
            steps.append(message_step("assistant", content_text(raw.get("message")), started_at=moment,
                                      payload={"llm_call_count": 0}))
    elif source == "agent":
        steps.append(_agent_call(raw, calls, moment, loc, where, llm_calls))
    else:
        steps.append(message_step(source, content_text(raw.get("message")), started_at=moment))
    results = [r for r in as_list(as_dict(raw.get("observation")).get("results")) if isinstance(r, dict)]
    # Trove marks a reply's tool calls that did not run as steps of their own (e.g. OpenHands "think")
    actions = [] if hint.get("calls_not_steps") else calls
    steps += _actions(actions, results, as_dict(hint.get("exit_codes")), loc, where, links)
    kinds = hint.get("kinds")
    if isinstance(kinds, list) and len(kinds) == len(steps):
        steps = [_relabel(step, str(kind)) for step, kind in zip(steps, kinds, strict=True)]
    if raw.get("is_copied_context") is True:  # context carried over, not this run's own turn (SFT filters it)
        for step in steps:
            step.payload["is_copied_context"] = True
    return steps


def _agent_call(
    raw: dict[str, Any], calls: list[Any], moment: Any, loc: Location, where: str, llm_calls: int | None
) -> StepRecord:
    metrics = as_dict(raw.get("metrics"))
    payload: dict[str, Any] = {}
    for key in ("cost_usd", "cached_tokens"):
        if metrics.get(key) is not None:
            payload[key] = metrics[key]
    payload.update(_token_payload(metrics, loc, where + ".metrics."))
    if raw.get("reasoning_effort") is not None:
        payload["reasoning_effort"] = raw["reasoning_effort"]
    if llm_calls is not None and llm_calls != 1:
        payload["llm_call_count"] = llm_calls
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


# ATIF metric -> the payload key the proxy records it under (experience.distill.rl_samples reads these)
TOKEN_FIELDS = {"prompt_token_ids": "prompt_token_ids", "completion_token_ids": "token_ids", "logprobs": "logprobs"}


def _token_payload(metrics: dict[str, Any], loc: Location, prefix: str) -> dict[str, Any]:
    """Token ids (integers) and logprobs (numbers) as the step payload keeps them; a list holding anything
    else is an error naming the field, since a shifted or mistyped id would train on the wrong token."""
    payload = {}
    for field, key in TOKEN_FIELDS.items():
        values = optional(metrics, field, list, loc, prefix=prefix)
        if values is None:
            continue
        kinds = (int,) if field != "logprobs" else (int, float)
        bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, kinds)), _NONE)
        if bad is not _NONE:
            what = "integers" if field != "logprobs" else "numbers"
            raise loc.invalid(prefix + field, f"must be a list of {what}, holds {bad!r}")
        payload[key] = values
    return payload


_NONE = object()


def _actions(
    calls: list[Any], results: list[dict[str, Any]], exit_codes: dict[str, Any], loc: Location, where: str,
    links: dict[str, str],
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
        steps += _action(call_id, name, as_dict(call.get("arguments")), answer, exit_codes.get(call_id), links)
    for leftover in [*by_id.values(), *loose]:
        steps.append(StepRecord(kind="observation", text=_result_text(leftover),
                                payload={**_call_payload(leftover), **_result_payload(leftover, links)}))
    return steps


def _action(
    call_id: str, name: str, arguments: dict[str, Any], result: dict[str, Any] | None, exit_code: Any,
    links: dict[str, str],
) -> list[StepRecord]:
    payload = {"tool": name, "tool_call_id": call_id}
    answer = _result_payload(result, links) if result is not None else {}
    command = shell_command(name, arguments)
    if command is not None:
        code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
        output = _result_text(result) if result is not None else None
        return [StepRecord(kind="command", command=command, output=output, exit_code=code,
                           payload={**payload, **answer})]
    steps = [
        StepRecord(kind="tool_call", tool_calls=[openai_tool_call(call_id, name, arguments)], payload=payload)
    ]
    if result is not None:
        steps.append(
            StepRecord(kind="observation", text=_result_text(result), payload={"tool_call_id": call_id, **answer})
        )
    return steps


def _result_payload(result: dict[str, Any], links: dict[str, str]) -> dict[str, Any]:
    """What a result says beyond its text: the subagent run it delegated to, and an error flag."""
    payload: dict[str, Any] = {}
    for reference in as_list(result.get("subagent_trajectory_ref")):
        reference = as_dict(reference)
        for key in (reference.get("trajectory_id"), reference.get("trajectory_path")):
            if isinstance(key, str) and key in links:
                payload.setdefault("subagent_source_ref", links[key])
    extra = as_dict(result.get("extra"))
    if isinstance(as_dict(extra.get(HINT_KEY)).get("subagent_source_ref"), str):  # Trove's export names the run
        payload.setdefault("subagent_source_ref", extra[HINT_KEY]["subagent_source_ref"])
    if extra.get("is_error") is True:
        payload["is_error"] = True
    return payload


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
    if result.get("content") is not None:
        return content_text(result.get("content"))
    refs = [as_dict(r) for r in as_list(result.get("subagent_trajectory_ref"))]
    names = [str(r.get("trajectory_id") or r.get("trajectory_path") or r.get("session_id")) for r in refs]
    return "subagent: " + ", ".join(names) if names else ""


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
