"""Claude Code session transcripts: ~/.claude/projects/<project>/<session>.jsonl, and the transcripts of the
subagents a session started, <session>/subagents/agent-<id>.jsonl beside it.

Each line is an object with `type`: `user`, `assistant`, `system`, `summary`, `file-history-snapshot` (or
`queue-operation`). User and assistant lines carry {uuid, parentUuid, sessionId, timestamp, cwd, gitBranch,
version, isSidechain, agentId?, message: an Anthropic message}. Claude Code writes one assistant reply
over several lines, one content block each (thinking, text, tool_use), all with the same `message.id`.

Steps: user text -> `message`; each assistant reply (its lines joined by message.id, even when tool
results were written between them) -> one `model_call` (text blocks as the reply, thinking blocks as
`text`, tool_use blocks as its tool calls in order, the context up to it, usage as tokens); each tool_use
-> a `command` (Bash, with its tool_result as output) or a `tool_call` followed by an `observation` when
its tool_result arrives; tool_result marked is_error -> is_error. System lines -> `note`. A tool_use no
result answered (an interrupted session) keeps output None and payload["unanswered"].

A session is one run, source_ref "claude-code:<sessionId>"; each subagent is a run of its own,
"claude-code:<sessionId>/agent-<agentId>", linked both ways (metadata["parent_source_ref"] and the parent's
metadata["subagent_source_refs"]; the Task call's observation names its subagent's run in
payload["subagent_source_ref"]). Refs come from the session ids, so the same session imported from
another folder is recognised. Parsing a session file also yields its subagents' runs; importing a subagent
file on its own yields the same run.

Real files hold what strict JSON refuses: redacted lines keep raw control characters (read with json's
strict=False); Windows paths are only text here; an interrupted session ends with tool calls no result
answered and Claude Code's "[Request interrupted by user ...]" turn, both kept. A line cut short is still
an error (the file is truncated), as in every format.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    as_list,
    count_or_none,
    is_naive_time,
    message_step,
    openai_tool_call,
    parse_time,
    shell_command,
    task_hash,
)
from experience.importers.limits import JsonTooDeep, loads_json
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT = "claude_code"
SOURCE_FORMAT = "claude-code-jsonl"
LINE_TYPES = frozenset({"user", "assistant", "system", "summary", "file-history-snapshot", "queue-operation"})
_SESSION_KEYS = ("sessionId", "parentUuid", "leafUuid", "messageId")


def detect(path: Path, head: bytes) -> bool:
    for raw in head.split(b"\n")[:5]:
        if not raw.strip():
            continue
        line = _loads(raw)
        if not isinstance(line, dict):
            return False
        if line.get("type") in LINE_TYPES and any(key in line for key in _SESSION_KEYS):
            return not _gemini_shaped(line)
        if line.get("type") not in ("summary", "file-history-snapshot", "queue-operation"):
            return False
    return False


def _gemini_shaped(line: dict[str, Any]) -> bool:
    """Qwen Code writes Claude Code's line envelope around Gemini messages ({role, parts}) and system payloads:
    not a Claude Code transcript (experience.importers.unsupported names it)."""
    return "parts" in as_dict(line.get("message")) or "systemPayload" in line


def _loads(raw: bytes) -> Any:
    try:
        return loads_json(raw, strict=False)
    except ValueError:
        return None


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    main = _read(path)
    if main.agent_id:  # a subagent's transcript on its own
        yield main.record(path)
        return
    subagents = [_read(p) for p in sorted((path.parent / path.stem / "subagents").glob("agent-*.jsonl"))]
    main.subagent_refs = [s.source_ref for s in subagents]
    yield main.record(path)
    for subagent in subagents:
        yield subagent.record(subagent.path)


# ---------------------------------------------------------------- reading one transcript


@dataclass
class _Pending:
    """A tool_use waiting for its tool_result."""

    step: StepRecord
    name: str
    is_command: bool


@dataclass
class _Transcript:
    path: Path
    session_id: str = ""
    agent_id: str = ""
    subagent_refs: list[str] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    context: list[MessageRecord] = field(default_factory=list)
    calls: dict[str, tuple[StepRecord, MessageRecord]] = field(default_factory=dict)  # message.id -> call, reply
    sidechain_file: bool | None = None  # whether the first user / assistant line was a sidechain's
    pending: dict[str, _Pending] = field(default_factory=dict)  # tool_use id -> waiting step
    meta: dict[str, Any] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    times: list[Any] = field(default_factory=list)
    naive_times: bool = False
    instruction: str = ""

    @property
    def source_ref(self) -> str:
        base = f"claude-code:{self.session_id or self.path.stem}"
        return f"{base}/agent-{self.agent_id}" if self.agent_id else base

    def record(self, path: Path) -> TrajectoryRecord:
        for pending in self.pending.values():
            pending.step.payload["unanswered"] = True
        metadata = dict(self.meta)
        metadata["models"] = self.models
        if self.subagent_refs:
            metadata["subagent_source_refs"] = self.subagent_refs
        if self.agent_id:  # a subagent's session is its parent's
            metadata["parent_source_ref"] = f"claude-code:{self.session_id or self.path.stem}"
        if self.naive_times:
            metadata["naive_timestamps_read_as_utc"] = True
        times = [t for t in self.times if t is not None]
        return TrajectoryRecord(
            source="import",
            source_format=SOURCE_FORMAT,
            source_version=str(self.meta.get("version") or ""),
            source_ref=self.source_ref,
            task_key=task_hash(self.instruction),
            instruction=self.instruction,
            harness="claude-code",
            model=self.models[0] if self.models else "",
            started_at=min(times) if times else None,
            finished_at=max(times) if times else None,
            metadata=metadata,
            steps=self.steps,
        )


def _read(path: Path) -> _Transcript:
    transcript = _Transcript(path=path)
    for number, line in _lines(path):
        loc = Location(path, line=number)
        if not isinstance(line, dict):
            raise loc.invalid(None, "each line must be a JSON object")
        _read_line(transcript, line, loc)
    return transcript


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Like base.iter_jsonl, but raw control characters inside strings are accepted (redacted lines)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            loc = Location(path, line=number)
            try:
                yield number, loads_json(raw, strict=False)
            except JsonTooDeep as exc:
                raise loc.malformed(f"{exc} (refused: the limit guards the importer)") from None
            except UnicodeDecodeError:
                raise loc.malformed("not UTF-8 text (corrupted file?)") from None
            except json.JSONDecodeError as exc:
                hint = " (the file ends mid-line: truncated?)" if not raw.endswith(b"\n") else " (corrupted?)"
                raise loc.malformed(f"invalid JSON at column {exc.colno}: {exc.msg}{hint}") from None


def _read_line(transcript: _Transcript, line: dict[str, Any], loc: Location) -> None:
    kind = line.get("type")
    if kind == "summary":
        transcript.meta.setdefault("summary", line.get("summary"))
        return
    if kind in ("file-history-snapshot", "queue-operation") or kind not in LINE_TYPES:
        return
    if transcript.sidechain_file is None and kind in ("user", "assistant"):
        transcript.sidechain_file = bool(line.get("isSidechain"))
    if line.get("isSidechain") and transcript.sidechain_file is False:
        return  # old versions wrote subagent lines into the session file: they are not this run's steps
    _remember(transcript, line, loc)
    if kind == "system":
        transcript.steps.append(_note(line, loc))
    elif kind == "assistant":
        _assistant(transcript, line, loc)
    else:
        _user(transcript, line, loc)


def _remember(transcript: _Transcript, line: dict[str, Any], loc: Location) -> None:
    transcript.session_id = transcript.session_id or str(line.get("sessionId") or "")
    if line.get("isSidechain") and line.get("agentId") and not transcript.agent_id:
        transcript.agent_id = str(line["agentId"])
    for key, meta in (("version", "version"), ("cwd", "cwd"), ("gitBranch", "git_branch"), ("slug", "slug"),
                      ("sessionId", "session_id"), ("agentId", "agent_id"), ("userType", "user_type")):
        if line.get(key) not in (None, "") and meta not in transcript.meta:
            transcript.meta[meta] = line[key]
    if line.get("version"):
        transcript.meta.setdefault("agent_version", line["version"])
    transcript.naive_times = transcript.naive_times or is_naive_time(line.get("timestamp"))
    transcript.times.append(_time(line, loc))


def _time(line: dict[str, Any], loc: Location) -> Any:
    return parse_time(line.get("timestamp"), loc, "timestamp")


def _note(line: dict[str, Any], loc: Location) -> StepRecord:
    payload = {"subtype": line["subtype"]} if isinstance(line.get("subtype"), str) else {}
    content = line.get("content")
    return StepRecord(kind="note", text=content if isinstance(content, str) else "", started_at=_time(line, loc), payload=payload)


def _user(transcript: _Transcript, line: dict[str, Any], loc: Location) -> None:
    message = as_dict(line.get("message"))
    content = message.get("content")
    at = _time(line, loc)
    if isinstance(content, str):
        _user_text(transcript, content, line, at)
        return
    texts = []
    for block in as_list(content):
        block = as_dict(block)
        if block.get("type") == "tool_result":
            _tool_result(transcript, block, line, at)
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "image":
            texts.append("[image]")
    if texts:
        _user_text(transcript, "\n".join(texts), line, at)


def _user_text(transcript: _Transcript, text: str, line: dict[str, Any], at: Any) -> None:
    payload = {"is_meta": True} if line.get("isMeta") else {}
    transcript.steps.append(message_step("user", text, started_at=at, payload=payload))
    transcript.context.append(MessageRecord(role="user", content=text))
    if not transcript.instruction and not line.get("isMeta"):
        transcript.instruction = text


def _tool_result(transcript: _Transcript, block: dict[str, Any], line: dict[str, Any], at: Any) -> None:
    call_id = str(block.get("tool_use_id") or "")
    output = _result_text(block.get("content"))
    error = bool(block.get("is_error")) or bool(as_dict(line.get("toolUseResult")).get("interrupted"))
    transcript.context.append(MessageRecord(role="tool", content=output, tool_call_id=call_id or None))
    pending = transcript.pending.pop(call_id, None)
    if pending is not None and pending.is_command:
        pending.step.output, pending.step.is_error, pending.step.ended_at = output, error, at
        return
    payload: dict[str, Any] = {"tool_call_id": call_id} if call_id else {}
    if pending is not None:
        payload["tool"] = pending.name
    agent = as_dict(line.get("toolUseResult")).get("agentId")
    if isinstance(agent, str) and agent:  # the Task call that ran a subagent: link to its run
        payload["subagent_source_ref"] = f"claude-code:{transcript.session_id}/agent-{agent}"
    transcript.steps.append(StepRecord(kind="observation", text=output, is_error=error, started_at=at,
                                       payload=payload))


def _result_text(content: Any) -> str:
    """A tool_result's content as it was given: text, or text blocks joined (images noted)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in as_list(content):
        block = as_dict(block)
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "image":
            parts.append("[image]")
    return "\n".join(parts)


def _assistant(transcript: _Transcript, line: dict[str, Any], loc: Location) -> None:
    message = as_dict(line.get("message"))
    message_id = str(message.get("id") or line.get("uuid") or f"line-{loc.line}")
    if message_id not in transcript.calls:
        transcript.calls[message_id] = _open_call(transcript, message, line, loc)
    call, reply = transcript.calls[message_id]
    _usage(call, as_dict(message.get("usage")))
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else as_list(content)
    for block in blocks:  # a reply given as plain text (some versions, API errors) is one text block
        _assistant_block(transcript, call, reply, as_dict(block), _time(line, loc))


def _open_call(
    transcript: _Transcript, message: dict[str, Any], line: dict[str, Any], loc: Location
) -> tuple[StepRecord, MessageRecord]:
    model = message.get("model") if isinstance(message.get("model"), str) else None
    if model and model not in transcript.models and model != "<synthetic>":
        transcript.models.append(model)
    call = StepRecord(kind="model_call", model=model, request_messages=list(transcript.context), response_text="",
                      started_at=_time(line, loc), payload={"message_id": message.get("id")} if message.get("id")
                      else {})
    reply = MessageRecord(role="assistant", content="")  # filled as the reply's lines arrive
    transcript.steps.append(call)
    transcript.context.append(reply)
    return call, reply


def _usage(call: StepRecord, usage: dict[str, Any]) -> None:
    """The reply's usage: every line of a split reply repeats it, growing; the last one holds."""
    if not usage:
        return
    counts = [count_or_none(usage.get(k)) for k in
              ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    if any(c is not None for c in counts):
        call.tokens_in = sum(c or 0 for c in counts)
    out = count_or_none(usage.get("output_tokens"))
    if out is not None:
        call.tokens_out = out


def _assistant_block(
    transcript: _Transcript, call: StepRecord, reply: MessageRecord, block: dict[str, Any], at: Any
) -> None:
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        call.response_text = _joined(call.response_text or "", block["text"])
        reply.content = call.response_text
    elif kind in ("thinking", "redacted_thinking"):
        call.text = _joined(call.text, str(block.get("thinking") or ""))
    elif kind == "tool_use":
        tool = openai_tool_call(block.get("id"), block.get("name"), block.get("input"))
        call.tool_calls = [*(call.tool_calls or []), tool]
        reply.tool_calls = call.tool_calls
        transcript.steps.append(_action(transcript, block, tool, at))


def _joined(before: str, more: str) -> str:
    return f"{before}\n{more}" if before and more else before or more


def _action(transcript: _Transcript, block: dict[str, Any], tool: dict[str, Any], at: Any) -> StepRecord:
    name, call_id = str(block.get("name") or ""), str(block.get("id") or "")
    command = shell_command(name, block.get("input"))
    payload: dict[str, Any] = {"tool": name, "tool_call_id": call_id} if call_id else {"tool": name}
    if command is not None:
        description = as_dict(block.get("input")).get("description")
        if isinstance(description, str):
            payload["description"] = description
        step = StepRecord(kind="command", command=command, started_at=at, payload=payload)
    else:
        step = StepRecord(kind="tool_call", tool_calls=[tool], started_at=at, payload=payload)
    if call_id:
        transcript.pending[call_id] = _Pending(step=step, name=name, is_command=command is not None)
    return step

