"""Codex CLI rollouts: ~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl (codex-rs `RolloutLine`).

Each line is {"timestamp", "type", "payload"} with type `session_meta` (id, cwd, originator, cli_version,
instructions, model_provider, git), `turn_context` (cwd, approval_policy, sandbox_policy, model, effort),
`response_item` (what went to and came from the model: `message` with role user / assistant / developer,
`reasoning`, `function_call` / `function_call_output`, `custom_tool_call` / `custom_tool_call_output`,
`local_shell_call`, `web_search_call`), `event_msg` (token_count, exec_command_end, turn_aborted,
user_message, agent_message, ...) or `compacted`. Rollouts older than the envelope (first line the
session {id, timestamp, instructions}, then bare response items) are read too.

Steps: user / developer / system messages -> `message` (the AGENTS.md and <environment_context> turns
Codex adds marked payload["context"]); each run of assistant-side items (reasoning, assistant messages,
tool calls) between inputs -> one `model_call` (assistant text as the reply, reasoning summaries and text
as `text`, calls as its tool calls, the following token_count event's last usage as tokens, the context
up to it); shell calls (`shell`, `shell_command`, `exec_command`, `local_shell_call`) -> `command` with the
call's output verbatim, its exit code (from the output's metadata, its "Exit code:" line, or the
exec_command_end event) and duration; other calls -> `tool_call` + `observation`. turn_aborted -> a `note`.
A run is the session: source_ref "codex:<session id>", model from turn_context, totals from the last
token_count in metadata["usage"].
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    as_list,
    content_text,
    count_or_none,
    first_json_line,
    is_naive_time,
    iter_jsonl,
    message_step,
    openai_tool_call,
    parse_time,
    seconds_to_ms,
    task_hash,
)
from experience.importers.limits import loads_json
from experience.records import MessageRecord, StepRecord, TrajectoryRecord

FORMAT = "codex"
SOURCE_FORMAT = "codex-rollout"
SHELL_CALLS = frozenset({"shell", "shell_command", "exec_command", "container.exec", "local_shell"})
_ASSISTANT_SIDE = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_CONTEXT_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")
_EXIT_LINE = re.compile(r"^(?:Exit code|Process exited with code):?\s*(-?\d+)", re.MULTILINE)
_LINE_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted"})


def detect(path: Path, head: bytes) -> bool:
    line = first_json_line(head)
    if not isinstance(line, dict):
        return False
    if line.get("type") in _LINE_TYPES and isinstance(line.get("payload"), dict):
        return line["type"] == "session_meta" or "timestamp" in line
    # the rollouts before the envelope: a session header line in a rollout-*.jsonl
    return path.name.startswith("rollout-") and {"id", "timestamp"} <= set(line) and "type" not in line


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    rollout = _Rollout(path)
    for number, line in iter_jsonl(path):
        loc = Location(path, line=number)
        if not isinstance(line, dict):
            raise loc.invalid(None, "each line must be a JSON object")
        rollout.read(line, loc)
    yield rollout.record()


@dataclass
class _Call:
    step: StepRecord
    reply: MessageRecord


@dataclass
class _Rollout:
    path: Path
    session: dict[str, Any] = field(default_factory=dict)
    turns: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    context: list[MessageRecord] = field(default_factory=list)
    current: _Call | None = None  # the model call assistant-side items are joining
    waiting: dict[str, StepRecord] = field(default_factory=dict)  # call_id -> command / tool_call step
    names: dict[str, str] = field(default_factory=dict)  # call_id -> tool name
    usage: dict[str, Any] = field(default_factory=dict)
    times: list[Any] = field(default_factory=list)
    naive: bool = False
    instruction: str = ""

    def read(self, line: dict[str, Any], loc: Location) -> None:
        at = parse_time(line.get("timestamp"), loc, "timestamp")
        self.times.append(at)
        self.naive = self.naive or is_naive_time(line.get("timestamp"))
        kind, payload = line.get("type"), as_dict(line.get("payload"))
        if kind not in _LINE_TYPES and "payload" not in line:  # pre-envelope rollout: the header, then bare items
            kind, payload = ("session_meta", line) if not self.session and "id" in line else ("response_item", line)
        if kind == "session_meta":
            self.session = self.session or payload
        elif kind == "turn_context":
            self.turns.append(payload)
        elif kind == "response_item":
            self._item(payload, at, loc)
        elif kind == "event_msg":
            self._event(payload, at)
        elif kind == "compacted":
            self._close()
            self.steps.append(StepRecord(kind="note", text=content_text(payload.get("message")), started_at=at,
                                         payload={"codex": "compacted"}))

    # ------------------------------------------------------------ response items

    def _item(self, item: dict[str, Any], at: Any, loc: Location) -> None:
        kind = item.get("type")
        if item.get("record_type") == "state":
            return
        if (kind == "message" and item.get("role") == "assistant") or kind in _ASSISTANT_SIDE:
            self._assistant_item(item, at)
        elif kind in _OUTPUTS:
            self._close()
            self._output(item, at)
        elif kind == "message":
            self._close()
            self._input_message(item, at)

    def _input_message(self, item: dict[str, Any], at: Any) -> None:
        role = str(item.get("role") or "user")
        text = content_text(item.get("content"))
        context = role == "user" and text.lstrip().startswith(_CONTEXT_PREFIXES)
        self.steps.append(message_step(role, text, started_at=at, payload={"context": True} if context else {}))
        self.context.append(MessageRecord(role=role, content=text))
        if role == "user" and not context and not self.instruction:
            self.instruction = text

    def _call(self, at: Any) -> _Call:
        if self.current is None:
            model = str(self.turns[-1].get("model") or "") if self.turns else ""
            step = StepRecord(kind="model_call", request_messages=list(self.context), response_text="",
                              model=model or None, started_at=at)
            reply = MessageRecord(role="assistant", content="")
            self.steps.append(step)
            self.context.append(reply)
            self.current = _Call(step, reply)
        return self.current

    def _close(self) -> None:
        self.current = None

    def _assistant_item(self, item: dict[str, Any], at: Any) -> None:
        call = self._call(at)
        kind = item.get("type")
        if kind == "message":
            call.step.response_text = _joined(call.step.response_text or "", content_text(item.get("content")))
            call.reply.content = call.step.response_text
        elif kind == "reasoning":
            call.step.text = _joined(call.step.text, _reasoning(item))
            if item.get("encrypted_content") and not _reasoning(item):
                call.step.payload["encrypted_reasoning"] = True
        else:
            self._tool_call(call, item, at)

    def _tool_call(self, call: _Call, item: dict[str, Any], at: Any) -> None:
        name, arguments = _name_and_arguments(item)
        call_id = str(item.get("call_id") or item.get("id") or "")
        tool = openai_tool_call(call_id or None, name, arguments)
        call.step.tool_calls = [*(call.step.tool_calls or []), tool]
        call.reply.tool_calls = call.step.tool_calls
        command = _command_line(name, arguments)
        payload: dict[str, Any] = {"tool": name, "tool_call_id": call_id} if call_id else {"tool": name}
        if command is not None:
            step = StepRecord(kind="command", command=command, started_at=at, payload=payload)
        else:
            step = StepRecord(kind="tool_call", tool_calls=[tool], started_at=at, payload=payload)
        self.steps.append(step)
        if call_id:
            self.waiting[call_id], self.names[call_id] = step, name

    def _output(self, item: dict[str, Any], at: Any) -> None:
        call_id = str(item.get("call_id") or "")
        text, exit_code, seconds = _output_parts(item.get("output"))
        self.context.append(MessageRecord(role="tool", content=text, tool_call_id=call_id or None))
        step = self.waiting.pop(call_id, None)
        if step is not None and step.kind == "command":
            step.output, step.ended_at = text, at
            step.exit_code = exit_code if step.exit_code is None else step.exit_code
            step.duration_ms = seconds_to_ms(seconds)
            step.is_error = step.exit_code not in (None, 0)
            return
        payload: dict[str, Any] = {"tool_call_id": call_id} if call_id else {}
        if call_id in self.names:
            payload["tool"] = self.names[call_id]
        self.steps.append(StepRecord(kind="observation", text=text, started_at=at, payload=payload))

    # ------------------------------------------------------------ events

    def _event(self, event: dict[str, Any], at: Any) -> None:
        kind = event.get("type")
        if kind == "token_count":
            self._tokens(as_dict(event.get("info")))
        elif kind == "exec_command_end":
            step = self._command_for(str(event.get("call_id") or ""))
            if step is not None and isinstance(event.get("exit_code"), int):
                step.exit_code = event["exit_code"]
                step.is_error = event["exit_code"] != 0
        elif kind == "turn_aborted":
            self._close()
            self.steps.append(StepRecord(kind="note", text=f"turn aborted: {event.get('reason') or 'interrupted'}",
                                         started_at=at, is_error=True, payload={"codex": "turn_aborted"}))

    def _command_for(self, call_id: str) -> StepRecord | None:
        step = self.waiting.get(call_id)
        if step is None:
            step = next((s for s in reversed(self.steps) if s.kind == "command"
                         and s.payload.get("tool_call_id") == call_id), None)
        return step

    def _tokens(self, info: dict[str, Any]) -> None:
        last, total = as_dict(info.get("last_token_usage")), as_dict(info.get("total_token_usage"))
        target = next((s for s in reversed(self.steps) if s.kind == "model_call"), None)
        if last and target is not None and target.tokens_in is None:
            target.tokens_in = count_or_none(last.get("input_tokens"))
            target.tokens_out = count_or_none(last.get("output_tokens"))
        if total:
            self.usage = total

    # ------------------------------------------------------------ the run

    def record(self) -> TrajectoryRecord:
        for step in self.waiting.values():  # calls the rollout ends before answering (an interrupted session)
            step.payload["unanswered"] = True
        times = [t for t in self.times if t is not None]
        models = [str(t["model"]) for t in self.turns if t.get("model")]
        session_id = str(self.session.get("id") or self.path.stem)
        return TrajectoryRecord(
            source="import",
            source_format=SOURCE_FORMAT,
            source_version=str(self.session.get("cli_version") or ""),
            source_ref=f"codex:{session_id}",
            task_key=task_hash(self.instruction),
            instruction=self.instruction,
            harness="codex",
            model=models[0] if models else "",
            started_at=min(times) if times else None,
            finished_at=max(times) if times else None,
            metadata=self._metadata(models),
            steps=self.steps,
        )

    def _metadata(self, models: list[str]) -> dict[str, Any]:
        metadata: dict[str, Any] = {k: v for k, v in self.session.items() if k != "instructions"}
        if self.session.get("cli_version"):
            metadata["agent_version"] = self.session["cli_version"]
        if isinstance(self.session.get("instructions"), str):
            metadata["instructions"] = self.session["instructions"]
        metadata["models"] = sorted(set(models), key=models.index)
        if self.turns:
            metadata["turn_context"] = self.turns[0]
        if self.usage:
            metadata["usage"] = {"tokens_in": count_or_none(self.usage.get("input_tokens")),
                                 "tokens_out": count_or_none(self.usage.get("output_tokens")),
                                 "cached_tokens_in": count_or_none(self.usage.get("cached_input_tokens"))}
        if self.naive:
            metadata["naive_timestamps_read_as_utc"] = True
        return metadata


def _joined(before: str, more: str) -> str:
    return f"{before}\n{more}" if before and more else before or more


def _reasoning(item: dict[str, Any]) -> str:
    parts = [as_dict(p).get("text") for p in as_list(item.get("summary"))]
    parts += [as_dict(p).get("text") for p in as_list(item.get("content"))]
    return "\n".join(p for p in parts if isinstance(p, str) and p)


def _name_and_arguments(item: dict[str, Any]) -> tuple[str, Any]:
    kind = item.get("type")
    if kind == "local_shell_call":
        return "local_shell", as_dict(item.get("action"))
    if kind == "web_search_call":
        return "web_search", as_dict(item.get("action"))
    if kind == "custom_tool_call":
        return str(item.get("name") or ""), item.get("input")  # free text (apply_patch's patch), kept as text
    return str(item.get("name") or ""), item.get("arguments")


def _command_line(name: str, arguments: Any) -> str | None:
    """The shell command a call ran: a command line, or an argv (["bash", "-lc", "ls"] gives "ls")."""
    if name not in SHELL_CALLS:
        return None
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError:
            return None
    arguments = as_dict(arguments)
    value = arguments.get("command", arguments.get("cmd"))
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(value) == 3 and value[1] in ("-lc", "-c") and value[0].endswith(("bash", "sh", "zsh")):
            return value[2]
        return shlex.join(value)
    return None


def _output_parts(output: Any) -> tuple[str, int | None, Any]:
    """(text, exit code, seconds) of a call's output: the JSON {"output", "metadata": {exit_code,
    duration_seconds}} older versions wrote as text, or the text itself (its "Exit code:" line read)."""
    if isinstance(output, str):
        try:
            parsed = loads_json(output)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
            meta = as_dict(parsed.get("metadata"))
            code = meta.get("exit_code")
            return parsed["output"], code if isinstance(code, int) else None, meta.get("duration_seconds")
        match = _EXIT_LINE.search(output)
        return output, int(match.group(1)) if match else None, None
    if isinstance(output, dict):
        return _output_parts(output.get("content", output.get("output", "")))
    return content_text(output), None, None
