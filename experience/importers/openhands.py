"""OpenHands: evaluation / resolver output (`output.jsonl`, one run per line) and event-stream JSON files
(a list of events, one run per file).

A line of output.jsonl: {instance_id?, instruction, history: [events], metrics: {accumulated_cost,
accumulated_token_usage, costs, response_latencies, token_usages}, test_result?: {git_patch, report?},
git_patch?, success?, result_explanation?, error?, metadata?: {agent_class, llm_config, dataset, ...},
instance?, issue?}.

Events come in two layouts. The event stream (OpenHands >= 0.9): {id, timestamp, source, message,
action | observation, args | extras, cause?, tool_call_metadata?: {model_response, tool_call_id, ...}}.
The older resolver layout: flat dicts {action, thought, command, ...} / {observation, content, exit_code,
...} with no ids, each observation following its action.

Steps: the first action of each distinct model response brings a `model_call` (reply, tool calls, tokens
from usage or metrics.token_usages, latency from metrics.response_latencies). `run` -> `command` merged with
its observation (output, exit code, start / end); `edit` with a diff -> `file_change` (text = the diff,
output = what the tool answered); other tool actions (read, run_ipython, browse, ...) -> `tool_call` with
their observations as `observation`; `message` / `system` / `think` / `finish` -> `message`; `error`
observations -> `observation` with is_error; `recall` and agent-state changes -> `note`. A resolver's
success verdict or a test report becomes an `eval` step, a run-level error a final `note`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    UniqueRefs,
    as_dict,
    as_list,
    before,
    content_text,
    count_or_none,
    first_json_line,
    first_line,
    is_naive_time,
    iter_jsonl,
    load_json_document,
    looks_like_diff,
    message_step,
    normalise_tool_calls,
    number_or_none,
    parse_time,
    read_head,
    ref_name,
    require,
    seconds_to_ms,
    task_hash,
    unique_call_ids,
)
from experience.records import StepRecord, TrajectoryRecord

FORMAT = "openhands"
OUTPUT_FORMAT = "openhands-output"
EVENTS_FORMAT = "openhands-events"

_EVENT_KEY = re.compile(rb'^\s*\[\s*\{.{0,4000}?"(action|observation)"\s*:\s*"', re.DOTALL)
_SKIPPED_OBSERVATIONS = {"null"}
_NOTE_ACTIONS = {"recall", "change_agent_state", "condensation", "condensation_request"}
_MESSAGE_ACTIONS = {"message", "system", "think", "finish", "reject"}


def detect(path: Path, head: bytes) -> bool:
    return _is_output_jsonl(head) or bool(_EVENT_KEY.match(head))


def _is_output_jsonl(head: bytes) -> bool:
    line = first_json_line(head)
    if isinstance(line, dict):
        return isinstance(line.get("history"), list) and ("instruction" in line or "instance_id" in line)
    # a first line longer than the head: judge by the keys OpenHands writes before the history
    start = first_line(head)
    return (
        start.startswith(b"{")
        and b'"history"' in start
        and (b'"instruction"' in start or b'"instance_id"' in start)
    )


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    if read_head(path, 4096).lstrip().startswith(b"["):
        yield _event_stream_record(path, name)
        return
    refs = UniqueRefs()
    for record_index, (line, obj) in enumerate(iter_jsonl(path)):
        loc = Location(path, line=line, record=record_index)
        yield _output_record(path, name, obj, loc, refs)


# ---------------------------------------------------------------- records


def _event_stream_record(path: Path, name: str | None) -> TrajectoryRecord:
    loc = Location(path)
    events = load_json_document(path)
    if not isinstance(events, list):
        raise loc.invalid(None, "an event-stream file must hold a JSON list of events")
    steps, summary = _steps_from_events(events, loc, "", {})
    return TrajectoryRecord(
        source="import",
        source_format=EVENTS_FORMAT,
        source_version=summary.version,
        source_ref=f"openhands:{ref_name(path, name)}",
        task_key=task_hash(summary.first_user_text) if summary.first_user_text else path.stem,
        instruction=summary.first_user_text,
        harness="openhands",
        model=summary.model,
        started_at=summary.first_time,
        finished_at=summary.last_time,
        metadata=summary.metadata(),
        steps=steps,
    )


def _output_record(
    path: Path, name: str | None, obj: Any, loc: Location, refs: UniqueRefs
) -> TrajectoryRecord:
    if not isinstance(obj, dict):
        raise loc.invalid(None, "each line must be a JSON object")
    events = require(obj, "history", list, loc)
    metrics = as_dict(obj.get("metrics"))
    meta = as_dict(obj.get("metadata"))
    steps, summary = _steps_from_events(events, loc, "history", metrics)
    task_key = _task_key(obj, loc)
    success, reward = _verdict(obj)
    steps += _closing_steps(obj, success)
    llm = as_dict(meta.get("llm_config"))
    test_result = as_dict(obj.get("test_result"))
    patch = (
        test_result.get("git_patch")
        if isinstance(test_result.get("git_patch"), str)
        else obj.get("git_patch")
    )
    return TrajectoryRecord(
        source="import",
        source_format=OUTPUT_FORMAT,
        source_version=summary.version,
        source_ref=refs.take(f"openhands:{ref_name(path, name)}#{task_key}"),
        task_key=task_key,
        instruction=content_text(obj.get("instruction")) or summary.first_user_text,
        task_set=str(meta.get("dataset") or ""),
        harness="openhands" + (f"/{meta['agent_class']}" if meta.get("agent_class") else ""),
        model=str(llm.get("model") or summary.model),
        reward=reward,
        success=success,
        cost=number_or_none(metrics.get("accumulated_cost")),
        started_at=summary.first_time,
        finished_at=summary.last_time,
        final_diff=patch if isinstance(patch, str) else "",
        metadata=_output_metadata(obj, meta, metrics, summary),
        steps=unique_call_ids(steps),
    )


def _task_key(obj: dict[str, Any], loc: Location) -> str:
    if obj.get("instance_id"):
        return str(obj["instance_id"])
    issue = as_dict(obj.get("issue"))
    if issue.get("repo") and issue.get("number") is not None:
        return f"{issue.get('owner')}/{issue['repo']}#{issue['number']}"
    raise loc.invalid("instance_id", "missing (and no issue to name the task)")


def _verdict(obj: dict[str, Any]) -> tuple[bool | None, float | None]:
    """success from a resolver line, or `resolved` from an evaluation report."""
    report = as_dict(as_dict(obj.get("test_result")).get("report"))
    for value in (
        obj.get("success"),
        report.get("resolved"),
        as_dict(obj.get("test_result")).get("resolved"),
    ):
        if isinstance(value, bool):
            return value, 1.0 if value else 0.0
    return None, None


def _closing_steps(obj: dict[str, Any], success: bool | None) -> list[StepRecord]:
    steps = []
    report = as_dict(as_dict(obj.get("test_result")).get("report"))
    if success is not None:
        payload: dict[str, Any] = {"success": success}
        if report:
            payload["report"] = report
        explanation = obj.get("result_explanation")
        steps.append(
            StepRecord(kind="eval", text=content_text(explanation) if explanation else "", payload=payload)
        )
    if obj.get("error"):
        steps.append(
            StepRecord(
                kind="note", text=content_text(obj["error"]), is_error=True, payload={"source": "run_error"}
            )
        )
    return steps


def _output_metadata(obj: dict, meta: dict, metrics: dict, summary: _Summary) -> dict[str, Any]:
    usage = as_dict(metrics.get("accumulated_token_usage"))
    metadata = summary.metadata()
    metadata["usage"] = {
        "tokens_in": count_or_none(usage.get("prompt_tokens")),
        "tokens_out": count_or_none(usage.get("completion_tokens")),
        "api_calls": len(as_list(metrics.get("response_latencies")))
        or len(as_list(metrics.get("costs")))
        or None,
    }
    for key in ("instance_id", "error", "result_explanation", "issue_type", "base_commit", "comment_success"):
        if obj.get(key) is not None:
            metadata[key] = obj[key]
    for key in ("agent_class", "max_iterations", "git_commit", "start_time", "dataset", "data_split"):
        if meta.get(key) is not None:
            metadata[key] = meta[key]
    if isinstance(obj.get("issue"), dict):
        metadata["issue"] = {
            k: v for k, v in obj["issue"].items() if k in ("owner", "repo", "number", "title")
        }
    if isinstance(obj.get("instance"), dict):
        metadata["instance"] = {
            k: v
            for k, v in obj["instance"].items()
            if isinstance(v, str | int) and k != "problem_statement" and len(str(v)) < 500
        }
    if isinstance(metrics.get("costs"), list):
        metadata["call_costs"] = [c.get("cost") if isinstance(c, dict) else c for c in metrics["costs"]]
    return metadata


# ---------------------------------------------------------------- events


class _Summary:
    """What the event walk learns about the run besides its steps."""

    def __init__(self) -> None:
        self.version = ""
        self.model = ""
        self.first_user_text = ""
        self.first_time: datetime | None = None
        self.last_time: datetime | None = None
        self.naive_times = False
        self.unmatched_responses: list[str] = []

    def saw_time(self, moment: datetime | None) -> None:
        if moment is None:
            return
        self.first_time = moment if self.first_time is None else min(self.first_time, moment)
        self.last_time = moment if self.last_time is None else max(self.last_time, moment)

    def metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.version:
            metadata["agent_version"] = self.version
        if self.naive_times:
            metadata["naive_timestamps_read_as_utc"] = True
        if self.unmatched_responses:
            metadata["responses_without_action"] = self.unmatched_responses
        return metadata


class _EventWalk:
    """Turns one run's events into steps. Holds the lookups the pairing needs."""

    def __init__(self, events: list[dict], loc: Location, prefix: str, metrics: dict[str, Any]) -> None:
        self.events = events
        self.loc = loc
        self.prefix = prefix
        self.summary = _Summary()
        self.latency = {
            x["response_id"]: x.get("latency") for x in _by_response(metrics, "response_latencies")
        }
        self.usage = {x["response_id"]: x for x in _by_response(metrics, "token_usages")}
        self.seen_responses: set[str] = set()
        has_ids = all("id" in e for e in events)
        self.answer = self._answers_by_cause() if has_ids else self._answers_by_position()
        self.consumed: set[int] = set()

    def _answers_by_cause(self) -> dict[int, int]:
        index_of = {e["id"]: i for i, e in enumerate(self.events)}
        answers: dict[int, int] = {}
        for i, event in enumerate(self.events):
            if "observation" in event and event.get("cause") in index_of:
                answers.setdefault(index_of[event["cause"]], i)
        return answers

    def _answers_by_position(self) -> dict[int, int]:
        answers: dict[int, int] = {}
        for i, event in enumerate(self.events[:-1]):
            if "action" in event and "observation" in self.events[i + 1]:
                answers[i] = i + 1
        return answers

    def where(self, index: int) -> str:
        return f"{self.prefix}[{index}]" if self.prefix else f"[{index}]"

    def time(self, event: dict[str, Any], index: int) -> datetime | None:
        moment = parse_time(event.get("timestamp"), self.loc, self.where(index) + ".timestamp")
        self.summary.naive_times |= is_naive_time(event.get("timestamp"))
        self.summary.saw_time(moment)
        return moment

    def steps(self) -> list[StepRecord]:
        steps: list[StepRecord] = []
        for index, event in enumerate(self.events):
            if index in self.consumed:
                continue
            if "action" in event:
                steps += self._action(event, index)
            elif "observation" in event:
                steps += self._observation(event, index, self.time(event, index))
            else:
                raise self.loc.invalid(self.where(index), "is neither an action nor an observation")
        self._note_unmatched_responses()
        return steps

    # -- actions

    def _action(self, event: dict[str, Any], index: int) -> list[StepRecord]:
        kind = str(event.get("action"))
        args = _args(event)
        moment = self.time(event, index)
        self._learn(event, kind, args)
        steps = self._model_call(event, moment)
        if (
            not steps
            and isinstance(args.get("thought"), str)
            and args["thought"]
            and kind not in _MESSAGE_ACTIONS
        ):
            # the older layout keeps the model's reasoning only on the action
            steps.append(message_step("assistant", args["thought"], started_at=moment, payload=_ids(event)))
        answer_index = self.answer.get(index)
        answer = self.events[answer_index] if answer_index is not None else None
        if kind == "run":
            if answer_index is not None:
                self.consumed.add(answer_index)
            steps.append(self._command(event, args, moment, answer, answer_index))
        elif kind in _MESSAGE_ACTIONS:
            steps.append(self._message(event, kind, args, moment))
        elif kind in _NOTE_ACTIONS:
            steps.append(
                StepRecord(
                    kind="note",
                    text=content_text(event.get("message")) or kind,
                    started_at=moment,
                    payload={**_ids(event), "action": kind},
                )
            )
        else:
            steps.append(self._tool_call(event, kind, args, moment))
        return steps

    def _learn(self, event: dict[str, Any], kind: str, args: dict[str, Any]) -> None:
        if kind == "system" and args.get("openhands_version"):
            self.summary.version = str(args["openhands_version"])
        if kind == "message" and self._source(event) == "user" and not self.summary.first_user_text:
            self.summary.first_user_text = content_text(args.get("content") or event.get("message"))

    def _source(self, event: dict[str, Any]) -> str:
        """Who sent an event. The older layout does not say; there the first message is the task."""
        if isinstance(event.get("source"), str):
            return event["source"]
        first_message = next(
            (e for e in self.events if isinstance(e, dict) and e.get("action") == "message"), None
        )
        return "user" if event is first_message else "agent"

    def _model_call(self, event: dict[str, Any], moment: datetime | None) -> list[StepRecord]:
        response = as_dict(as_dict(event.get("tool_call_metadata")).get("model_response"))
        response_id = response.get("id")
        if not isinstance(response_id, str) or response_id in self.seen_responses:
            return []
        self.seen_responses.add(response_id)
        choice = as_dict(as_list(response.get("choices"))[0] if as_list(response.get("choices")) else {})
        message = as_dict(choice.get("message"))
        usage = as_dict(response.get("usage")) or as_dict(self.usage.get(response_id))
        latency = seconds_to_ms(self.latency.get(response_id))
        model = response.get("model") if isinstance(response.get("model"), str) else None
        if model and not self.summary.model:
            self.summary.model = model
        return [
            StepRecord(
                kind="model_call",
                response_text=content_text(message.get("content")),
                text=content_text(message.get("reasoning_content")),
                tool_calls=normalise_tool_calls(message.get("tool_calls")),
                model=model,
                tokens_in=count_or_none(usage.get("prompt_tokens")),
                tokens_out=count_or_none(usage.get("completion_tokens")),
                latency_ms=latency,
                started_at=before(moment, latency),
                ended_at=moment,
                call_id=response_id,
                response_json=response,
                payload={"finish_reason": choice.get("finish_reason")} if choice.get("finish_reason") else {},
            )
        ]

    def _command(
        self, event: dict, args: dict, moment: datetime | None, answer: dict | None, answer_index: int | None
    ) -> StepRecord:
        payload = _ids(event)
        step = StepRecord(
            kind="command", command=content_text(args.get("command")), started_at=moment, payload=payload
        )
        if answer is None or answer_index is None:
            return step
        extras = _extras(answer)
        metadata = as_dict(extras.get("metadata"))
        code = metadata.get("exit_code", extras.get("exit_code"))
        step.output = content_text(answer.get("content"))
        step.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        step.ended_at = self.time(answer, answer_index)
        if answer.get("id") is not None:
            payload["observation_id"] = answer["id"]
        if step.ended_at and step.started_at and step.ended_at < step.started_at:
            step.ended_at = None
        return step

    def _message(self, event: dict, kind: str, args: dict, moment: datetime | None) -> StepRecord:
        role = "system" if kind == "system" else ("user" if self._source(event) == "user" else "assistant")
        if kind == "think":
            text = content_text(args.get("thought"))
        elif kind == "finish":
            text = content_text(
                args.get("final_thought")
                or args.get("thought")
                or event.get("message")
                or as_dict(args.get("outputs")).get("content")
            )
        else:
            text = content_text(args.get("content") or event.get("message"))
        payload = {**_ids(event), "action": kind}
        if kind == "finish" and args.get("task_completed") is not None:
            payload["task_completed"] = args["task_completed"]
        return message_step(role, text, started_at=moment, payload=payload)

    def _tool_call(self, event: dict, kind: str, args: dict, moment: datetime | None) -> StepRecord:
        metadata = as_dict(event.get("tool_call_metadata"))
        call_id = metadata.get("tool_call_id")
        name = metadata.get("function_name") or kind
        arguments = {
            k: v
            for k, v in args.items()
            if k
            not in ("thought", "is_confirmed", "confirmation_state", "security_risk", "hidden", "impl_source")
        }
        call = {"type": "function", "function": {"name": name, "arguments": _json(arguments)}}
        if call_id:
            call = {"id": call_id, **call}
        return StepRecord(
            kind="tool_call",
            tool_calls=[call],
            started_at=moment,
            payload={**_ids(event), "action": kind, "tool": name},
        )

    # -- observations

    def _observation(self, event: dict[str, Any], index: int, moment: datetime | None) -> list[StepRecord]:
        kind = str(event.get("observation"))
        if kind in _SKIPPED_OBSERVATIONS:
            return []
        extras = _extras(event)
        content = content_text(event.get("content"))
        payload = {**_ids(event), "observation": kind}
        if kind == "agent_state_changed":
            return [
                StepRecord(
                    kind="note",
                    text=f"agent state: {extras.get('agent_state')}",
                    started_at=moment,
                    payload={**payload, "agent_state": extras.get("agent_state")},
                )
            ]
        if kind == "edit":
            change = _edit_change(content, extras)
            if change is not None:
                payload["path"] = extras.get("path")
                return [
                    StepRecord(
                        kind="file_change",
                        text=change[0],
                        output=change[1],
                        started_at=moment,
                        payload=payload,
                    )
                ]
        if kind == "run":
            code = as_dict(extras.get("metadata")).get("exit_code", extras.get("exit_code"))
            if isinstance(code, int) and not isinstance(code, bool):
                payload["exit_code"] = code
        is_error = kind == "error" or (kind in ("edit", "read") and content.lstrip().startswith("ERROR"))
        return [
            StepRecord(
                kind="observation", text=content, is_error=is_error, started_at=moment, payload=payload
            )
        ]

    def _note_unmatched_responses(self) -> None:
        self.summary.unmatched_responses = [
            r for r in self.latency if isinstance(r, str) and r not in self.seen_responses
        ]


def _by_response(metrics: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Per-call metric entries that name their model response."""
    entries = as_list(metrics.get(key))
    return [x for x in entries if isinstance(x, dict) and isinstance(x.get("response_id"), str)]


def _edit_change(content: str, extras: dict[str, Any]) -> tuple[str, str] | None:
    """(diff, what the tool told the agent) of an edit, or None when it changed nothing (an error).
    Newer OpenHands puts the diff in extras.diff; early 2025 versions made it the content and kept the
    agent's view in extras.formatted_output_and_error."""
    diff = extras.get("diff")
    if isinstance(diff, str) and diff.strip():
        return diff, content
    if looks_like_diff(content):
        return content, content_text(extras.get("formatted_output_and_error"))
    return None


def _steps_from_events(
    events: list[Any], loc: Location, prefix: str, metrics: dict[str, Any]
) -> tuple[list[StepRecord], _Summary]:
    # the oldest layout stores [action, observation] pairs
    flat: list[Any] = []
    for event in events:
        flat.extend(event if isinstance(event, list) else [event])
    for index, event in enumerate(flat):
        if not isinstance(event, dict):
            raise loc.invalid(f"{prefix}[{index}]" if prefix else f"[{index}]", "must be an object")
        for key in ("id", "cause"):
            if event.get(key) is not None and not isinstance(event[key], int | str):
                raise loc.invalid(f"{prefix}[{index}].{key}", "must be an integer")
    walk = _EventWalk(flat, loc, prefix, metrics)
    return walk.steps(), walk.summary


_META_KEYS = {
    "id",
    "timestamp",
    "source",
    "message",
    "action",
    "observation",
    "cause",
    "args",
    "extras",
    "tool_call_metadata",
    "llm_metrics",
    "timeout",
    "content",
}


def _args(event: dict[str, Any]) -> dict[str, Any]:
    if isinstance(event.get("args"), dict):
        return event["args"]
    return {k: v for k, v in event.items() if k not in _META_KEYS - {"content"}}


def _extras(event: dict[str, Any]) -> dict[str, Any]:
    if isinstance(event.get("extras"), dict):
        return event["extras"]
    return {k: v for k, v in event.items() if k not in _META_KEYS}


def _ids(event: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for key in ("id", "cause", "source"):
        if event.get(key) is not None:
            payload[f"event_{key}"] = event[key]
    call_id = as_dict(event.get("tool_call_metadata")).get("tool_call_id")
    if call_id:
        payload["tool_call_id"] = call_id
    return payload


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
