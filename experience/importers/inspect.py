"""Inspect AI eval logs: the JSON log (`*.json`, one document) and the binary log (`*.eval`, a zip holding
header.json, samples/<id>_epoch_<n>.json, reductions.json, summaries.json and _journal/).

One run per sample and epoch. A sample holds input, target, messages, output, scores, metadata,
model_usage, attachments (text moved out of events, referenced as "attachment://<hash>") and events.

Steps: the sample's opening system / user messages -> `message`; `model` events -> `model_call` (the
input messages as request context, the reply and its tool calls, usage tokens, timestamp -> completed,
working_time as latency, the provider's raw response when logged); `tool` events -> a `command` for
shell tools (bash) with the result as output, otherwise a `tool_call` and an `observation`; `sandbox`
events -> `sandbox_event`; `score` events -> `eval`; `error` / `logger` / `info` / `sample_limit` ->
`note`; `input` -> user `message`. Span, state, store, step and sample_init events only structure the
log and are left out. A sample without events is read from its messages. The first scorer's value is
the reward (C=1, P=0.5, I=N=0, numbers as they are, true/false as 1/0); success is reward == 1 or 0.
"""

from __future__ import annotations

import json
import re
import zipfile
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    as_list,
    before,
    content_text,
    count_or_none,
    load_json_document,
    message_record,
    message_step,
    normalise_tool_calls,
    openai_tool_call,
    parse_json_bytes,
    parse_time,
    reasoning_text,
    seconds_to_ms,
    shell_command,
    sum_counts,
    unique_call_ids,
)
from experience.importers.chat import steps_from_chat
from experience.importers.errors import ImportFormatError
from experience.importers.limits import ArchiveBudget, LimitBreached, read_member
from experience.records import StepRecord, TrajectoryRecord

FORMAT = "inspect"
SOURCE_FORMAT = "inspect-eval"
_ZIP_MAGIC = b"PK\x03\x04"
_JSON_LOG = re.compile(rb'^\s*\{\s*"version"\s*:\s*\d+\s*,')
_SCORE_VALUES = {"C": 1.0, "P": 0.5, "I": 0.0, "N": 0.0}
_NOTE_EVENTS = {"error", "logger", "info", "sample_limit", "approval", "subtask"}
_SKIPPED_EVENTS = {"span_begin", "span_end", "state", "store", "step", "sample_init"}
_ATTACHMENT = "attachment://"


def detect(path: Path, head: bytes) -> bool:
    if head.startswith(_ZIP_MAGIC):
        return path.suffix == ".eval" or _zip_has_header(path)
    return bool(_JSON_LOG.match(head)) and b'"eval"' in head


def _zip_has_header(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
    return "header.json" in names or "_journal/start.json" in names


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    with open(path, "rb") as handle:
        is_zip = handle.read(4) == _ZIP_MAGIC
    if is_zip:
        yield from _parse_eval_zip(path)
    else:
        yield from _parse_json_log(path)


def _parse_json_log(path: Path) -> Iterator[TrajectoryRecord]:
    loc = Location(path)
    log = load_json_document(path)
    if not isinstance(log, dict):
        raise loc.invalid(None, "an Inspect log must be a JSON object")
    header = _header(log, loc)
    samples = log.get("samples")
    if samples is not None and not isinstance(samples, list):
        raise loc.invalid("samples", "must be a list")
    for index, sample in enumerate(samples or []):
        yield _record(header, sample, Location(path, record=index), f"samples[{index}].")


def _parse_eval_zip(path: Path) -> Iterator[TrajectoryRecord]:
    """Reads one sample file at a time, so a log with thousands of samples is never held whole; every member
    is read within the archive limits of experience.importers.limits (a zip bomb stops at its first chunk
    over them)."""
    loc = Location(path)
    budget = ArchiveBudget(archive_bytes=path.stat().st_size)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            header_name = "header.json" if "header.json" in names else "_journal/start.json"
            if header_name not in names:
                raise loc.malformed(
                    "no header.json or _journal/start.json in the archive (not an Inspect .eval log?)"
                )
            header = _header(_member_json(archive, header_name, loc, budget), loc)
            samples = sorted(
                (n for n in names if n.startswith("samples/") and n.endswith(".json")), key=_sample_order
            )
            for index, member in enumerate(samples):
                sample_loc = Location(path, record=index)
                sample = _member_json(archive, member, sample_loc, budget)
                yield _record(header, sample, sample_loc, f"{member}: ")
    except zipfile.BadZipFile as exc:
        raise loc.malformed(
            f"not a readable zip archive ({exc}): truncated or corrupted .eval log?"
        ) from None
    except (zlib.error, EOFError) as exc:
        raise loc.malformed(f"archive member cannot be decompressed ({exc}): corrupted .eval log?") from None


def _member_json(archive: zipfile.ZipFile, member: str, loc: Location, budget: ArchiveBudget) -> Any:
    try:
        data = read_member(archive, archive.getinfo(member), budget)
    except LimitBreached as exc:
        raise ImportFormatError(loc.path, str(exc), record=loc.record) from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ImportFormatError(
            loc.path, f"{member}: cannot be read from the archive ({exc}): corrupted?", record=loc.record
        ) from None
    return parse_json_bytes(data, loc)


def _sample_order(member: str) -> tuple:
    # samples/<id>_epoch_<n>.json: ids in natural order, then epochs
    stem = member.removeprefix("samples/").removesuffix(".json")
    sample_id, _, epoch = stem.rpartition("_epoch_")
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", sample_id)), int(epoch or 0)


# ---------------------------------------------------------------- header and records


class _Header:
    def __init__(self, log: dict[str, Any], eval_spec: dict[str, Any]) -> None:
        self.version = str(log.get("version") or "")
        self.eval = eval_spec
        self.status = log.get("status")
        self.identity = str(
            eval_spec.get("eval_id") or f"{eval_spec.get('run_id')}.{eval_spec.get('task_id')}"
        )
        self.task = str(eval_spec.get("task") or "")
        self.model = str(eval_spec.get("model") or "")
        self.agent_version = str(as_dict(eval_spec.get("packages")).get("inspect_ai") or "")


def _header(log: Any, loc: Location) -> _Header:
    if not isinstance(log, dict):
        raise loc.invalid(None, "the log header must be a JSON object")
    eval_spec = as_dict(log.get("eval"))
    if not eval_spec:
        raise loc.invalid("eval", "missing")
    if not eval_spec.get("task"):
        raise loc.invalid("eval.task", "missing")
    return _Header(log, eval_spec)


def _record(header: _Header, sample: Any, loc: Location, prefix: str) -> TrajectoryRecord:
    if not isinstance(sample, dict):
        raise loc.invalid(prefix.rstrip(". :") or None, "a sample must be an object")
    sample = _resolve(sample, as_dict(sample.get("attachments")))
    sample_id = sample.get("id")
    if sample_id is None:
        raise loc.invalid(prefix + "id", "missing")
    epoch = sample.get("epoch", 1)
    steps = unique_call_ids(_steps(sample, loc, prefix))
    reward, success, scorer = _reward(as_dict(sample.get("scores")))
    times = [t for s in steps for t in (s.started_at, s.ended_at) if t]
    return TrajectoryRecord(
        source="import",
        source_format=SOURCE_FORMAT,
        source_version=header.version,
        source_ref=f"inspect:{header.identity}/{sample_id}/epoch-{epoch}",
        task_key=f"{header.task}/{sample_id}",
        task_set=header.task,
        instruction=_instruction(sample.get("input")),
        harness="inspect-ai",
        model=header.model,
        reward=reward,
        success=success,
        started_at=min(times) if times else None,
        finished_at=max(times) if times else None,
        metadata=_metadata(header, sample, scorer, epoch),
        steps=steps,
    )


def _metadata(header: _Header, sample: dict[str, Any], scorer: str | None, epoch: Any) -> dict[str, Any]:
    usage = [as_dict(u) for u in as_dict(sample.get("model_usage")).values()]
    metadata: dict[str, Any] = {
        "eval_task": header.task,
        "eval_id": header.eval.get("eval_id"),
        "run_id": header.eval.get("run_id"),
        "sample_id": sample.get("id"),
        "epoch": epoch,
        "target": sample.get("target"),
        "scores": sample.get("scores") or {},
        "reward_scorer": scorer,
        "sample_metadata": as_dict(sample.get("metadata")),
        "usage": {
            "tokens_in": sum_counts([count_or_none(u.get("input_tokens")) for u in usage]),
            "tokens_out": sum_counts([count_or_none(u.get("output_tokens")) for u in usage]),
            "api_calls": None,
        },
    }
    for key in ("uuid", "total_time", "working_time", "error"):
        if sample.get(key) is not None:
            metadata[key] = sample[key]
    if header.agent_version:
        metadata["agent_version"] = header.agent_version
    return metadata


def _instruction(sample_input: Any) -> str:
    if isinstance(sample_input, list):  # a list of chat messages: the task is the last user turn
        users = [m for m in sample_input if isinstance(m, dict) and m.get("role") == "user"]
        return content_text(users[-1].get("content")) if users else ""
    return content_text(sample_input)


def _reward(scores: dict[str, Any]) -> tuple[float | None, bool | None, str | None]:
    for scorer, score in scores.items():
        value = _score_value(as_dict(score).get("value"))
        if value is not None:
            return value, (True if value == 1.0 else False if value == 0.0 else None), scorer
    return None, None, None


def _score_value(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if value in _SCORE_VALUES:
            return _SCORE_VALUES[value]
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _resolve(value: Any, attachments: dict[str, Any]) -> Any:
    """Put attachment text back where Inspect replaced it with "attachment://<hash>"."""
    if isinstance(value, str):
        if value.startswith(_ATTACHMENT):
            return attachments.get(value[len(_ATTACHMENT) :], value)
        return value
    if isinstance(value, list):
        return [_resolve(v, attachments) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, attachments) for k, v in value.items() if k != "attachments"}
    return value


# ---------------------------------------------------------------- steps


def _steps(sample: dict[str, Any], loc: Location, prefix: str) -> list[StepRecord]:
    messages = sample.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise loc.invalid(prefix + "messages", "must be a list")
    events = sample.get("events")
    if not isinstance(events, list) or not events:
        return steps_from_chat(messages or [], loc, prefix=prefix + "messages")
    steps: list[StepRecord] = []
    scoring = _ScorerSpans()
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise loc.invalid(f"{prefix}events[{index}]", "must be an object")
        in_scorer = scoring.inside(event)
        for step in _event_steps(event, loc, f"{prefix}events[{index}]"):
            steps.append(_as_grading(step) if in_scorer and step.kind == "model_call" else step)
    return _opening(messages or []) + _in_time_order(steps)


class _ScorerSpans:
    """Tells whether an event happened while a scorer ran: a model-graded scorer's calls are grading,
    not the agent's decisions. Newer logs nest events in spans (span_begin with type and parent_id);
    older ones bracket them with step begin / end events."""

    def __init__(self) -> None:
        self.span_type: dict[str, str] = {}
        self.span_parent: dict[str, str | None] = {}
        self.open_steps: list[str] = []

    def inside(self, event: dict[str, Any]) -> bool:
        kind = event.get("event") if isinstance(event.get("event"), str) else None
        if kind == "span_begin" and isinstance(event.get("id"), str):
            self.span_type[event["id"]] = str(event.get("type") or "")
            self.span_parent[event["id"]] = event.get("parent_id")
        elif kind == "step" and event.get("action") == "begin":
            self.open_steps.append(str(event.get("type") or ""))
        elif kind == "step" and event.get("action") == "end" and self.open_steps:
            self.open_steps.pop()
        return "scorer" in self.open_steps or self._span_is_scorer(event.get("span_id"))

    def _span_is_scorer(self, span: Any) -> bool:
        seen = 0
        while isinstance(span, str) and seen < 100:  # parent links come from the file: bound the walk
            if self.span_type.get(span) in ("scorer", "scorers"):
                return True
            span, seen = self.span_parent.get(span), seen + 1
        return False


def _as_grading(call: StepRecord) -> StepRecord:
    """A scorer's model call kept as part of the evaluation: reply as text, usage and context kept."""
    call.kind = "eval"
    call.text = call.response_text or ""
    call.payload["grader_model_call"] = True
    return call


def _in_time_order(steps: list[StepRecord]) -> list[StepRecord]:
    """Inspect logs a tool event before the sandbox events inside it; its answer belongs at completion.
    A tool's observation carries only its end time, so ordering by (start or end) puts it there."""
    moments = [s.started_at or s.ended_at for s in steps]
    if any(m is None for m in moments):
        return steps
    order = sorted(range(len(steps)), key=lambda i: (moments[i], i))
    return [steps[i] for i in order]


def _opening(messages: list[Any]) -> list[StepRecord]:
    steps = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "user"):
            break
        steps.append(message_step(str(message["role"]), content_text(message.get("content"))))
    return steps


def _event_steps(event: dict[str, Any], loc: Location, where: str) -> list[StepRecord]:
    kind = event.get("event") if isinstance(event.get("event"), str) else None
    started = parse_time(event.get("timestamp"), loc, where + ".timestamp")
    ended = parse_time(event.get("completed"), loc, where + ".completed")
    if ended and started and ended < started:
        ended = None
    if kind == "model":
        return [_model_call(event, started, ended)]
    if kind == "tool":
        return _tool(event, started, ended)
    if kind == "sandbox":
        return [_sandbox(event, started, ended)]
    if kind == "score":
        return [_score(event, started)]
    if kind == "input":
        return [message_step("user", content_text(event.get("input")), started_at=started)]
    if kind in _NOTE_EVENTS:
        return [_note(event, kind, started)]
    return []  # span / state / store / step / sample_init, and kinds newer than this reader


def _model_call(event: dict[str, Any], started: datetime | None, ended: datetime | None) -> StepRecord:
    output = as_dict(event.get("output"))
    choices = as_list(output.get("choices"))
    message = as_dict(as_dict(choices[0]).get("message")) if choices else {}
    usage = as_dict(output.get("usage"))
    call = as_dict(event.get("call"))
    latency = seconds_to_ms(event.get("working_time")) or seconds_to_ms(output.get("time"))
    payload: dict[str, Any] = {}
    if choices and as_dict(choices[0]).get("stop_reason"):
        payload["stop_reason"] = choices[0]["stop_reason"]
    if event.get("cache"):
        payload["cache"] = event["cache"]
    return StepRecord(
        kind="model_call",
        request_messages=[message_record(m) for m in as_list(event.get("input")) if isinstance(m, dict)],
        response_text=content_text(message.get("content")),
        text=reasoning_text(message.get("content")),
        tool_calls=normalise_tool_calls(message.get("tool_calls")),
        model=str(output.get("model") or event.get("model") or "") or None,
        tokens_in=count_or_none(usage.get("input_tokens")),
        tokens_out=count_or_none(usage.get("output_tokens")),
        latency_ms=latency,
        started_at=started or before(ended, latency),
        ended_at=ended,
        call_id=_call_id(event, call, message),
        response_json=as_dict(call.get("response")) or output or None,
        is_error=bool(event.get("error")),
        payload=payload,
    )


def _call_id(event: dict[str, Any], call: dict[str, Any], message: dict[str, Any]) -> str | None:
    for candidate in (event.get("uuid"), as_dict(call.get("response")).get("id"), message.get("id")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return None


def _tool(event: dict[str, Any], started: datetime | None, ended: datetime | None) -> list[StepRecord]:
    name = str(event.get("function") or "")
    arguments = event.get("arguments")
    call_id = event.get("id") if isinstance(event.get("id"), str) else None
    result = content_text(event.get("result"))
    error = as_dict(event.get("error"))
    duration = seconds_to_ms(event.get("working_time"))
    payload: dict[str, Any] = {"tool": name, **({"tool_call_id": call_id} if call_id else {})}
    if error:
        payload["error"] = error
    command = shell_command(name, arguments)
    if command is not None:
        text = result or content_text(error.get("message"))
        return [
            StepRecord(
                kind="command",
                command=command,
                output=text,
                started_at=started,
                ended_at=ended,
                duration_ms=duration,
                is_error=bool(error),
                payload=payload,
            )
        ]
    call = StepRecord(
        kind="tool_call",
        tool_calls=[openai_tool_call(call_id, name, arguments)],
        started_at=started,
        payload=dict(payload),
    )
    answer = StepRecord(
        kind="observation",
        text=result or content_text(error.get("message")),
        ended_at=ended,
        duration_ms=duration,
        is_error=bool(error),
        payload=payload,
    )
    return [call, answer]


def _sandbox(event: dict[str, Any], started: datetime | None, ended: datetime | None) -> StepRecord:
    action = str(event.get("action") or "")
    code = event.get("result")
    return StepRecord(
        kind="sandbox_event",
        text=action if action != "exec" else "",
        command=content_text(event.get("cmd")) if event.get("cmd") is not None else None,
        output=content_text(event.get("output")) if event.get("output") is not None else None,
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        started_at=started,
        ended_at=ended,
        payload={k: event[k] for k in ("action", "file", "options") if event.get(k) is not None},
    )


def _score(event: dict[str, Any], started: datetime | None) -> StepRecord:
    score = as_dict(event.get("score"))
    text = content_text(score.get("explanation") or score.get("answer") or "")
    payload = {
        "value": score.get("value"),
        "reward": _score_value(score.get("value")),
        "intermediate": bool(event.get("intermediate")),
    }
    if event.get("target") is not None:
        payload["target"] = event["target"]
    if score.get("answer") is not None:
        payload["answer"] = score["answer"]
    return StepRecord(kind="eval", text=text, started_at=started, payload=payload)


def _note(event: dict[str, Any], kind: str, started: datetime | None) -> StepRecord:
    body = next((event[k] for k in ("error", "message", "data", "limit") if event.get(k)), kind)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        text = body["message"]
    else:
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, default=str)
    return StepRecord(
        kind="note",
        text=text,
        started_at=started,
        is_error=kind in ("error", "sample_limit"),
        payload={"event": kind},
    )
