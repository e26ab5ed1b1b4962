"""Export a run as ATIF, the Agent Trajectory Interchange Format (Harbor / terminal-bench), schema v1.7.

Trove steps fold into ATIF turns: a `model_call` (or an assistant `message`) opens an agent step whose
message is the reply; the `command` and `tool_call` steps after it become that step's tool_calls (a
command as {"function_name": "bash", "arguments": {"command": ...}}, its output the matching observation
result); observation-like steps (`observation`, `file_change`, `eval`, `note`, `sandbox_event`) become
observation results, tied by source_call_id to the tool call they answer. System and user messages are
system / user steps. Per-call tokens and cost go to the agent step's metrics (with the call's prompt and
completion token ids and logprobs where the proxy recorded them); run totals to final_metrics. An agent step
opened by a model call says `llm_call_count` 1 (or the count an imported step carried); one that only holds
actions with no call before them says 0, v1.7's mark of a deterministic dispatch. `trajectory_id` is the
run's source_ref. A result that delegated to a subagent names the subagent's run in its
`extra["trove"]["subagent_source_ref"]`: the subagent is a run of its own, exported on its own, and v1.7's
`subagent_trajectory_ref` must resolve within the document, so it is not used.

What ATIF has no field for rides in `extra["trove"]`: per step the Trove kinds folded into it (so a
re-import restores `file_change` / `eval` / `note` rather than a generic observation) and exit codes; at
the root the run's task key, instruction, outcome and metadata. Request contexts, response bodies and
step payloads are not exported.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import IO, Any

from experience.importers.atif import HINT_KEY, TOKEN_FIELDS
from experience.importers.base import SHELL_TOOLS, tool_call_parts
from experience.records import StepRecord, TrajectoryRecord

SCHEMA_VERSION = "ATIF-v1.7"


def write(record: TrajectoryRecord) -> dict[str, Any]:
    """The run as one ATIF document (a dict ready for json.dumps)."""
    document = _root(record)
    steps = list(iter_steps(record))
    document["steps"] = steps
    document["final_metrics"] = _final_metrics(record, len(steps))
    return document


def dump(record: TrajectoryRecord, fileobj: IO[Any]) -> None:
    """Write one ATIF document step by step, without building the whole document in memory."""
    _emit(fileobj, _open_document(record))
    count = 0
    for step in iter_steps(record):
        _emit(fileobj, ("," if count else "") + json.dumps(step, ensure_ascii=False))
        count += 1
    _emit(fileobj, '],"final_metrics":' + json.dumps(_final_metrics(record, count)) + "}")


def dump_lines(records: Iterable[TrajectoryRecord], fileobj: IO[Any]) -> int:
    """Write many runs as JSONL, one ATIF document per line. Returns how many."""
    count = 0
    for record in records:
        dump(record, fileobj)
        _emit(fileobj, "\n")
        count += 1
    return count


def _open_document(record: TrajectoryRecord) -> str:
    head = json.dumps(_root(record), ensure_ascii=False)
    return head[:-1] + ',"steps":['  # reopen the root object to stream the steps into it


def _emit(fileobj: IO[Any], text: str) -> None:
    binary = isinstance(fileobj, io.RawIOBase | io.BufferedIOBase) or "b" in getattr(fileobj, "mode", "")
    fileobj.write(text.encode() if binary else text)


def _root(record: TrajectoryRecord) -> dict[str, Any]:
    agent: dict[str, Any] = {
        "name": record.harness or record.source_format or "unknown",
        "version": str(record.metadata.get("agent_version") or "unknown"),
    }
    if record.model:
        agent["model_name"] = record.model
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": record.source_ref,
        "trajectory_id": record.source_ref,
        "agent": agent,
        "notes": f"Exported by Trove from {record.source_format or record.source} ({record.source_ref}).",
        "extra": {HINT_KEY: _run_fields(record)},
    }


def _run_fields(record: TrajectoryRecord) -> dict[str, Any]:
    return {
        "source": record.source,
        "source_format": record.source_format,
        "source_version": record.source_version,
        "source_ref": record.source_ref,
        "task_key": record.task_key,
        "task_set": record.task_set,
        "instruction": record.instruction,
        "harness": record.harness,
        "model": record.model,
        "status": record.status,
        "reward": record.reward,
        "success": record.success,
        "cost": record.cost,
        "final_diff": record.final_diff,
        "started_at": _iso(record.started_at),
        "finished_at": _iso(record.finished_at),
        "metadata": record.metadata,
    }


def _final_metrics(record: TrajectoryRecord, step_count: int) -> dict[str, Any]:
    calls = [s for s in record.steps if s.kind == "model_call"]
    metrics: dict[str, Any] = {"total_steps": step_count}
    prompt = [s.tokens_in for s in calls if s.tokens_in is not None]
    completion = [s.tokens_out for s in calls if s.tokens_out is not None]
    if prompt:
        metrics["total_prompt_tokens"] = sum(prompt)
    if completion:
        metrics["total_completion_tokens"] = sum(completion)
    if record.cost is not None:
        metrics["total_cost_usd"] = record.cost
    return metrics


def iter_steps(record: TrajectoryRecord) -> Iterator[dict[str, Any]]:
    """ATIF steps of a run, in order, one at a time."""
    folder = _Folder()
    for index, step in enumerate(record.steps):
        yield from folder.feed(index, step)
    yield from folder.close()


class _Turn:
    """An ATIF step being filled: the Trove steps folded into it so far."""

    def __init__(
        self, source: str, message: str, moment: datetime | None, *, continuation: bool = False
    ) -> None:
        self.body: dict[str, Any] = {"source": source, "message": message}
        if moment is not None:
            self.body["timestamp"] = moment.isoformat()
        self.kinds: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []
        self.exit_codes: dict[str, int] = {}
        self.continuation = continuation
        self.pending_call: str | None = None  # a tool call still waiting for its answer
        # an unanswered result arrived: a later action would be read back before it, so it opens a new turn
        self.closed = False
        self.response_calls: list[dict[str, Any]] = []

    def finish(self, step_id: int) -> dict[str, Any]:
        body = {"step_id": step_id, **self.body}
        calls = self.calls or [
            _atif_call(c, f"call_{step_id}_{i}") for i, c in enumerate(self.response_calls)
        ]
        if calls:
            body["tool_calls"] = calls
        if self.results:
            body["observation"] = {"results": self.results}
        hint: dict[str, Any] = {"kinds": self.kinds}
        if calls and not self.calls:
            hint["calls_not_steps"] = True  # the reply's tool calls, not run as steps of their own
        if self.exit_codes:
            hint["exit_codes"] = self.exit_codes
        if self.continuation:
            hint["continuation"] = True
            if self.body["source"] == "agent":
                body["llm_call_count"] = 0  # actions no model call of this run opened
        body["extra"] = {**body.get("extra", {}), HINT_KEY: hint}
        return body


class _Folder:
    def __init__(self) -> None:
        self.turn: _Turn | None = None
        self.step_id = 0

    def feed(self, index: int, step: StepRecord) -> Iterator[dict[str, Any]]:
        role = str(step.payload.get("role") or "")
        if step.kind == "model_call":
            yield from self._open(_agent_turn(step))
        elif step.kind == "message" and role != "tool":
            yield from self._open(_message_turn(step, role))
        elif step.kind in ("command", "tool_call"):
            if self.turn is None or self.turn.body["source"] != "agent" or self.turn.closed:
                yield from self._open(_Turn("agent", "", step.started_at, continuation=True))
            assert self.turn is not None
            self._add_action(self.turn, index, step)
        else:  # observation-like, or a tool message; ATIF gives observations to agent and system steps
            if self.turn is None or self.turn.body["source"] == "user":
                yield from self._open(
                    _Turn("system", "", step.started_at or step.ended_at, continuation=True)
                )
            assert self.turn is not None
            self._add_result(self.turn, step)

    def close(self) -> Iterator[dict[str, Any]]:
        if self.turn is not None:
            self.step_id += 1
            yield self.turn.finish(self.step_id)
            self.turn = None

    def _open(self, turn: _Turn) -> Iterator[dict[str, Any]]:
        yield from self.close()
        self.turn = turn

    def _add_action(self, turn: _Turn, index: int, step: StepRecord) -> None:
        turn.kinds.append(step.kind)
        if step.kind == "command":
            call_id = _fresh_id(turn, step.payload.get("tool_call_id") or f"call_{index}")
            tool = step.payload.get("tool")
            name = tool if isinstance(tool, str) and tool.lower() in SHELL_TOOLS else "bash"
            turn.calls.append(
                {"tool_call_id": call_id, "function_name": name, "arguments": {"command": step.command or ""}}
            )
            if step.output is not None:
                turn.results.append(_with_extra({"source_call_id": call_id, "content": step.output}, step))
            if step.exit_code is not None:
                turn.exit_codes[call_id] = step.exit_code
            turn.pending_call = None
            return
        for offset, call in enumerate(step.tool_calls or [{}]):
            fallback = step.payload.get("tool_call_id") or f"call_{index}_{offset}"
            atif_call = _atif_call(call, fallback)
            atif_call["tool_call_id"] = _fresh_id(turn, atif_call["tool_call_id"])
            turn.calls.append(atif_call)
            turn.pending_call = atif_call["tool_call_id"]

    def _add_result(self, turn: _Turn, step: StepRecord) -> None:
        turn.kinds.append(step.kind)
        result: dict[str, Any] = {"content": step.text}
        if turn.pending_call is not None:
            result = {"source_call_id": turn.pending_call, **result}
            turn.pending_call = None
        else:
            turn.closed = True
        turn.results.append(_with_extra(result, step))


def _with_extra(result: dict[str, Any], step: StepRecord) -> dict[str, Any]:
    """A result with what v1.7's result `extra` carries for Trove: an error flag, and the subagent run."""
    extra: dict[str, Any] = {}
    if step.payload.get("is_error") is True:
        extra["is_error"] = True
    if isinstance(step.payload.get("subagent_source_ref"), str):
        extra[HINT_KEY] = {"subagent_source_ref": step.payload["subagent_source_ref"]}
    return {**result, "extra": extra} if extra else result


def _agent_turn(step: StepRecord) -> _Turn:
    turn = _Turn("agent", step.response_text or "", step.started_at or step.ended_at)
    turn.kinds.append("model_call")
    if step.model:
        turn.body["model_name"] = step.model
    if step.text:
        turn.body["reasoning_content"] = step.text
    metrics = _metrics(step)
    if metrics:
        turn.body["metrics"] = metrics
    count = step.payload.get("llm_call_count")
    turn.body["llm_call_count"] = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
    turn.response_calls = step.tool_calls or []
    return turn


def _message_turn(step: StepRecord, role: str) -> _Turn:
    source = {"assistant": "agent", "system": "system", "developer": "system"}.get(role, "user")
    turn = _Turn(source, step.text, step.started_at or step.ended_at)
    turn.kinds.append("message")
    return turn


def _metrics(step: StepRecord) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    if step.tokens_in is not None:
        metrics["prompt_tokens"] = step.tokens_in
    if step.tokens_out is not None:
        metrics["completion_tokens"] = step.tokens_out
    cost = step.payload.get("cost", step.payload.get("cost_usd"))
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        metrics["cost_usd"] = cost
    metrics.update(_token_metrics(step.payload))
    if step.latency_ms is not None:
        metrics["extra"] = {"latency_ms": step.latency_ms}
    return metrics


def _token_metrics(payload: dict[str, Any]) -> dict[str, Any]:
    """The call's token ids and logprobs, as ATIF names them (the inverse of the importer's TOKEN_FIELDS).
    The proxy keeps a logprob as {token, logprob, ...}: ATIF wants the number; a list with any entry that is
    not one is left out rather than shifted."""
    metrics: dict[str, Any] = {}
    for field, key in TOKEN_FIELDS.items():
        values = payload.get(key)
        if not isinstance(values, list):
            continue
        if field == "logprobs":
            values = [v.get("logprob") if isinstance(v, dict) else v for v in values]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                continue
        elif not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            continue
        metrics[field] = values
    return metrics


def _atif_call(call: dict[str, Any], fallback_id: str) -> dict[str, Any]:
    call_id, name, arguments = tool_call_parts(call)
    if not isinstance(arguments, dict):  # ATIF arguments must be an object
        arguments = {} if arguments in (None, "") else {"input": arguments}
    return {"tool_call_id": call_id or fallback_id, "function_name": name, "arguments": arguments}


def _fresh_id(turn: _Turn, call_id: str) -> str:
    taken = {c["tool_call_id"] for c in turn.calls}
    candidate, n = call_id, 1
    while candidate in taken:
        n += 1
        candidate = f"{call_id}~{n}"
    return candidate


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
