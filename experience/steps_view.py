"""The step view model: the one place that turns a stored step into what the run page, the steps API and
exports show. ORM-free: plain functions over StepRecords and dicts, unit-tested without Django.

`step_view` gives a JSON-able dict per step (the browser renders it; templates never dig in a payload):
- every kind: `id`, `seq`, `kind`, `title` (one line), `started_at`, `duration_ms` (the stored duration, else
  the span between both timestamps), `is_error`, `failed` (an error, a non-zero exit, a failed evaluation);
- a model call: `response`, `reasoning` (the thinking an importer kept in `text`), `tool_calls`
  (`{id, name, arguments}` with arguments pretty-printed), tokens, latency, time to first token, stop reason;
- a tool call: `tool_calls`, as above; a result (command, observation, file edit): `result_of` (its call id);
- a command: `command`, `exit_code`, `output` (at most OUTPUT_CHARS, `output_chars` the whole length);
- an evaluation: `score` (`value`, `reward`, `target`, `answer`, `passed`, `explanation`), and the command
  and output of an evaluation that ran one;
- a file edit: `diff` (see `diff_view`), build artefacts left out.

`link_tool_calls` pairs calls with their results by call id across a window of a run, so a page can link a
call to its result (and back) even when the two land in different pages of steps.
`context_lens` compares a model call's context with the previous call's: what is unchanged, what is new,
and where the harness rewrote history.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from experience.records import MessageRecord, StepRecord

OUTPUT_CHARS = 20_000  # a step's output in a page of steps; the single-step view carries the whole of it
TITLE_CHARS = 160
RESULT_KINDS = frozenset({"command", "observation", "file_change", "tool_call"})
_ARTEFACT = re.compile(r"(^|/)__pycache__(/|$)|\.py[co]$")
_DIFF_PATH = re.compile(r"^diff --git a/(.*?) b/(.*)$")


def step_view(
    record: StepRecord, *, seq: int, step_id: int | None = None, value_estimate: float | None = None,
    n_context: int | None = None, full_output: bool = False,
) -> dict[str, Any]:
    """What a page shows of one step. `n_context`: the number of messages the call saw (known from the row
    without reading the context). `full_output`: the whole output, not its first OUTPUT_CHARS."""
    view: dict[str, Any] = {
        "id": step_id, "seq": seq, "kind": record.kind, "started_at": _iso(record.started_at),
        "duration_ms": duration_ms(record), "is_error": record.is_error, "value_estimate": value_estimate,
    }
    build = _BUILDERS.get(record.kind, _plain_text)
    view.update(build(record))
    if record.kind == "model_call" and n_context is None and record.request_messages is not None:
        n_context = len(record.request_messages)
    if n_context is not None:
        view["n_context"] = n_context
    if "output" in view and view["output"] is not None and not full_output:
        view["output_chars"] = len(view["output"])
        view["output"] = view["output"][:OUTPUT_CHARS]
    view["failed"] = bool(record.is_error or _nonzero(record.exit_code) or _score_failed(view))
    view["title"] = _title(view)[:TITLE_CHARS]
    return {key: value for key, value in view.items() if value is not None}


def duration_ms(record: StepRecord) -> float | None:
    """The stored duration, or the span between the step's two timestamps (imports store both, not this)."""
    if record.duration_ms is not None:
        return record.duration_ms
    if record.started_at and record.ended_at:
        return max(0.0, (record.ended_at - record.started_at).total_seconds() * 1000)
    return None


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _nonzero(code: int | None) -> bool:
    return code is not None and code != 0


def _title(view: dict[str, Any]) -> str:
    """One line saying what the step did: the call's tools, the command, the verdict, the first line."""
    kind = view["kind"]
    calls = view.get("tool_calls")
    if calls and kind in ("model_call", "tool_call"):
        return ", ".join(f"{call['name']}()" for call in calls)
    if kind == "eval":
        return _verdict(view["score"])
    if view.get("command"):
        return "$ " + view["command"].split("\n", 1)[0]
    if kind == "file_change" and view.get("path"):
        return "edit " + view["path"]
    text = view.get("response") or view.get("text") or view.get("action") or ""
    return text.strip().split("\n", 1)[0]


def _verdict(score: dict[str, Any]) -> str:
    passed = {True: "passed", False: "failed", None: "scored"}[score.get("passed")]
    value = score.get("value", score.get("reward"))
    return passed + (f": {value}" if value is not None else "")


# ---------------------------------------------------------------- per kind


def _model_call(record: StepRecord) -> dict[str, Any]:
    payload = record.payload
    return {
        "model": record.model, "response": record.response_text or "", "reasoning": record.text or None,
        "tool_calls": tool_calls_view(record.tool_calls), "tokens_in": record.tokens_in,
        "tokens_out": record.tokens_out, "latency_ms": record.latency_ms, "ttft_ms": record.ttft_ms,
        "stop_reason": payload.get("stop_reason") or payload.get("finish_reason"), "call_id": record.call_id,
    }


def _tool_call(record: StepRecord) -> dict[str, Any]:
    calls = tool_calls_view(record.tool_calls)
    if not calls and record.payload.get("tool"):  # a call an importer kept by name only
        calls = [{"id": record.payload.get("tool_call_id"), "name": str(record.payload["tool"]),
                  "arguments": record.text or ""}]
    return {"tool_calls": calls, "text": record.text or None if not calls else None}


def _command(record: StepRecord) -> dict[str, Any]:
    return {"command": record.command if record.command is not None else record.text, "output": record.output,
            "exit_code": record.exit_code, "tool": record.payload.get("tool"), "result_of": _result_of(record),
            "unanswered": record.payload.get("unanswered")}


def _observation(record: StepRecord) -> dict[str, Any]:
    return {"text": record.text, "tool": record.payload.get("tool"), "result_of": _result_of(record)}


def _file_change(record: StepRecord) -> dict[str, Any]:
    diff_text = record.text if _looks_like_diff(record.text) else ""
    return {"path": record.payload.get("path"), "diff": diff_view(diff_text) if diff_text else None,
            "text": None if diff_text else record.text, "output": record.output, "result_of": _result_of(record)}


def _eval(record: StepRecord) -> dict[str, Any]:
    payload = record.payload
    view: dict[str, Any] = {"score": score_view(record)}
    if record.command is not None:
        view.update(command=record.command, output=record.output, exit_code=record.exit_code)
    if payload.get("grader_model_call"):
        view.update(model=record.model, tokens_in=record.tokens_in, tokens_out=record.tokens_out,
                    latency_ms=record.latency_ms, grader=True)
    return view


def _message(record: StepRecord) -> dict[str, Any]:
    return {"role": record.payload.get("role"), "text": record.text}


def _sandbox_event(record: StepRecord) -> dict[str, Any]:
    return {"action": record.payload.get("action") or record.text or None, "command": record.command,
            "output": record.output, "exit_code": record.exit_code}


def _plain_text(record: StepRecord) -> dict[str, Any]:
    return {"text": record.text or record.output or ""}


_BUILDERS = {
    "model_call": _model_call, "tool_call": _tool_call, "command": _command, "observation": _observation,
    "file_change": _file_change, "eval": _eval, "message": _message, "sandbox_event": _sandbox_event,
}


def _result_of(record: StepRecord) -> str | None:
    call_id = record.payload.get("tool_call_id")
    return str(call_id) if call_id else None


def tool_calls_view(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Each tool call as its id, name and pretty-printed arguments (OpenAI and flat shapes)."""
    if not calls:
        return None
    return [_tool_call_view(call) for call in calls if isinstance(call, dict)]


def _tool_call_view(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"] if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments", function.get("input", function.get("args")))
    return {"id": call.get("id"), "name": str(function.get("name") or call.get("type") or "tool"),
            "arguments": pretty_arguments(arguments)}


def pretty_arguments(arguments: Any) -> str:
    """Arguments as indented JSON when they are JSON (a string of it, as OpenAI sends, or an object)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    if arguments is None:
        return ""
    return json.dumps(arguments, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------- scores


def score_view(record: StepRecord) -> dict[str, Any]:
    """An evaluation's verdict as each source names it: the score's value, the reward, target and answer,
    pass / fail, and the grader's explanation."""
    payload = record.payload
    value = payload.get("value", payload.get("score"))
    reward = payload.get("reward")
    answer = payload.get("answer")
    explanation = record.text or ""
    if answer is not None and explanation == str(answer):
        explanation = ""  # Inspect keeps the answer as text when the scorer gave no explanation
    view = {"value": value, "reward": reward, "target": _target(payload.get("target")), "answer": answer,
            "passed": _passed(payload, value, reward, record.exit_code), "explanation": explanation or None}
    return {key: item for key, item in view.items() if item is not None}


def _target(target: Any) -> Any:
    if isinstance(target, list):
        return ", ".join(str(item) for item in target)
    return target if target != "" else None


def _passed(payload: dict[str, Any], value: Any, reward: Any, exit_code: int | None) -> bool | None:
    if isinstance(payload.get("success"), bool):
        return payload["success"]
    if isinstance(value, str) and value.upper() in ("C", "I"):  # Inspect's CORRECT / INCORRECT
        return value.upper() == "C"
    if isinstance(value, bool):
        return value
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        return reward > 0
    if exit_code is not None:
        return exit_code == 0
    return None


def _score_failed(view: dict[str, Any]) -> bool:
    return view.get("kind") == "eval" and view.get("score", {}).get("passed") is False


# ---------------------------------------------------------------- diffs


def _looks_like_diff(text: str) -> bool:
    return text.startswith(("--- ", "diff --git", "@@", "Index: ")) or "\n+++ " in text[:2000]


def diff_view(diff: str) -> dict[str, Any]:
    """A unified diff split by file, build artefacts (`__pycache__`, `*.pyc`) left out and named in `omitted`.
    Each file's `text` keeps its header and hunks; a page colours lines by their first character."""
    files, omitted = [], []
    for path, text in _diff_files(diff):
        if path and _ARTEFACT.search(path):
            omitted.append(path)
        else:
            files.append({"path": path, "text": text, "added": _count(text, "+"), "removed": _count(text, "-")})
    return {"files": files, "omitted": omitted}


def diff_lines(diff: str, *, nested: bool = False) -> list[tuple[str, str]]:
    """Each line of a unified diff with its class for colouring: file, hunk, add, del or ctx. `nested`: a diff
    of two diffs, whose own file headers are only its first two lines (the rest are the patches' lines)."""
    if not diff:
        return []
    lines = diff.split("\n")
    if nested:
        return [("file", line) for line in lines[:2]] + [(_nested_class(line), line) for line in lines[2:]]
    return [(_line_class(line), line) for line in lines]


def _nested_class(line: str) -> str:
    return "hunk" if line.startswith("@@") else {"+": "add", "-": "del"}.get(line[:1], "ctx")


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff ")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "ctx")


def _count(text: str, sign: str) -> int:
    header = sign * 3 + " "
    return sum(1 for line in text.split("\n") if line.startswith(sign) and not line.startswith(header))


def _diff_files(diff: str) -> Iterable[tuple[str, str]]:
    """(path, section) per file: a section starts at `diff --git`, or at `--- ` not inside a hunk."""
    sections: list[list[str]] = []
    in_git_header = False
    for line in diff.replace("\r\n", "\n").split("\n"):
        starts = line.startswith("diff --git ") or (
            line.startswith("--- ") and not in_git_header and not (sections and _in_hunk(sections[-1])))
        if starts or not sections:
            sections.append([])
        in_git_header = line.startswith("diff --git ") or (in_git_header and not line.startswith("@@"))
        sections[-1].append(line)
    for lines in sections:
        text = "\n".join(lines).strip("\n")
        if text:
            yield _section_path(lines), text


def _in_hunk(lines: list[str]) -> bool:
    """Whether the section's last hunk still expects lines (a `--- ` inside it is a removed `-- ` line)."""
    for index in range(len(lines) - 1, -1, -1):
        match = re.match(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", lines[index])
        if match:
            old = int(match.group(1) or 1)
            new = int(match.group(2) or 1)
            body = lines[index + 1 :]
            seen_old = sum(1 for line in body if line[:1] in (" ", "-", ""))
            seen_new = sum(1 for line in body if line[:1] in (" ", "+", ""))
            return seen_old < old or seen_new < new
    return False


def _section_path(lines: list[str]) -> str:
    for line in lines:
        match = _DIFF_PATH.match(line)
        if match:
            return match.group(2)
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            return _strip_prefix(line[4:].split("\t")[0].strip())
        if line.startswith("--- ") and not line.startswith("--- /dev/null"):
            path = _strip_prefix(line[4:].split("\t")[0].strip())
            if path:
                return path
        if line.startswith("Binary files "):
            return line.split(" and ")[-1].split(" differ")[0].removeprefix("b/")
    return ""


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path


# ---------------------------------------------------------------- links between calls and results


@dataclass(frozen=True)
class LinkRow:
    """What linking needs of a step: its seq, kind, the call id a result answers, and the calls it makes."""

    seq: int
    kind: str
    tool_call_id: str | None = None
    tool_calls: Sequence[dict[str, Any]] | None = None


def link_tool_calls(rows: Iterable[LinkRow]) -> dict[str, dict[str, int]]:
    """Call id -> {"call": seq of the step that made the call, "result": seq of the step that answered}.
    A tool-call step (Inspect, OpenHands) is the call's home over the model call that emitted it."""
    links: dict[str, dict[str, int]] = {}
    for row in rows:
        for call in row.tool_calls or ():
            if isinstance(call, dict) and call.get("id"):
                entry = links.setdefault(str(call["id"]), {})
                if row.kind == "tool_call" or "call" not in entry:
                    entry["call"] = row.seq
        if row.tool_call_id and row.kind != "tool_call":
            links.setdefault(row.tool_call_id, {}).setdefault("result", row.seq)
    return links


def attach_links(views: Iterable[dict[str, Any]], links: dict[str, dict[str, int]]) -> None:
    """Write each call's result seq into its tool-call entry and each result's call seq beside `result_of`."""
    for view in views:
        for call in view.get("tool_calls") or ():
            entry = links.get(str(call.get("id")))
            if entry and "result" in entry:
                call["result_seq"] = entry["result"]
        if view.get("result_of"):
            entry = links.get(view["result_of"], {})
            if "call" in entry:
                view["call_seq"] = entry["call"]


# ---------------------------------------------------------------- the context lens


def message_view(message: MessageRecord, index: int) -> dict[str, Any]:
    view: dict[str, Any] = {"index": index, "role": message.role, "content": message.content}
    if message.name:
        view["name"] = message.name
    if message.tool_calls:
        view["tool_calls"] = tool_calls_view(message.tool_calls)
    if message.tool_call_id:
        view["tool_call_id"] = message.tool_call_id
    return view


def context_lens(previous: Sequence[MessageRecord] | None, current: Sequence[MessageRecord]) -> dict[str, Any]:
    """What a model call saw measured against the previous call of its run.

    `unchanged`: how many leading messages are the previous call's, unchanged; `new`: the messages after the
    last one the two share (what the model sees for the first time), highlighted by a page; `rewrites`: where
    the history before that was changed: `dropped`, `edited`, `inserted` (a new system reminder is an
    inserted system message) or `compacted` (several messages replaced by fewer), each with a unified diff.
    Without a previous call everything is new."""
    if previous is None:
        return {"first": True, "unchanged": 0, "total": len(current), "rewrites": [],
                "new": [message_view(m, i) for i, m in enumerate(current)]}
    old_keys = [_message_key(m) for m in previous]
    new_keys = [_message_key(m) for m in current]
    matcher = difflib.SequenceMatcher(a=old_keys, b=new_keys, autojunk=False)
    blocks = [block for block in matcher.get_matching_blocks() if block.size]
    unchanged = blocks[0].size if blocks and blocks[0].a == 0 and blocks[0].b == 0 else 0
    tail_start = blocks[-1].b + blocks[-1].size if blocks else 0
    rewrites = [_rewrite(tag, previous, current, i1, i2, j1, j2)
                for tag, i1, i2, j1, j2 in matcher.get_opcodes()
                if tag != "equal" and not (tag == "insert" and j1 >= tail_start)]
    return {"first": False, "unchanged": unchanged, "total": len(current), "previous_total": len(previous),
            "rewrites": rewrites, "new": [message_view(current[i], i) for i in range(tail_start, len(current))]}


def _message_key(message: MessageRecord) -> str:
    return json.dumps(message.as_openai(), sort_keys=True, ensure_ascii=False)


def _rewrite(tag: str, previous: Sequence[MessageRecord], current: Sequence[MessageRecord],
             i1: int, i2: int, j1: int, j2: int) -> dict[str, Any]:
    before, after = previous[i1:i2], current[j1:j2]
    if tag == "delete":
        kind = "dropped"
    elif tag == "insert":
        kind = "system_reminder" if all(m.role == "system" for m in after) else "inserted"
    elif len(before) > len(after):
        kind = "compacted"
    else:
        kind = "edited"
    return {"kind": kind, "at": j1, "removed": i2 - i1, "added": j2 - j1, "diff": _messages_diff(before, after)}


def _messages_diff(before: Sequence[MessageRecord], after: Sequence[MessageRecord]) -> str:
    lines = difflib.unified_diff(_message_lines(before), _message_lines(after), "previous call", "this call",
                                 lineterm="", n=2)
    return "\n".join(lines)


def _message_lines(messages: Sequence[MessageRecord]) -> list[str]:
    lines: list[str] = []
    for message in messages:
        lines.append(f"[{message.role}]")
        lines.extend(message.content.split("\n"))
        if message.tool_calls:
            lines.extend(json.dumps(message.tool_calls, ensure_ascii=False, indent=1).split("\n"))
    return lines


# ---------------------------------------------------------------- token counts in the context lens


@dataclass(frozen=True)
class CallTokens:
    """A model call's recorded size: prompt and completion tokens, counted from the token ids the proxy kept
    (vLLM's `return_token_ids`) when there are any, else from the upstream's usage; `source` says which."""

    prompt: int | None
    completion: int | None
    source: str | None


def call_tokens(record: StepRecord) -> CallTokens:
    prompt_ids, completion_ids = record.payload.get("prompt_token_ids"), record.payload.get("token_ids")
    completion = len(completion_ids) if isinstance(completion_ids, list) else record.tokens_out
    if isinstance(prompt_ids, list) and prompt_ids:
        return CallTokens(len(prompt_ids), completion, "token ids")
    return CallTokens(record.tokens_in, completion, "usage" if record.tokens_in is not None else None)


def attach_message_tokens(lens: dict[str, Any], context: Sequence[MessageRecord], previous: CallTokens | None,
                          current: CallTokens) -> None:
    """Token counts on the lens's new messages, where the records allow (`context`: the messages this call
    saw). The new block's size is the prompt-token delta between the two calls when this call only extends
    the previous one's context (exact: the harness appended, nothing else changed); after a rewrite, or
    without the previous call's count, it is this prompt's tokens in proportion to characters (estimated).
    Within the block a lone message gets all of it; with several, the previous call's reply gets that call's
    completion tokens and the rest is shared by characters (estimated). Each message says whether its count
    is `tokens_estimated`; the lens says where the counts came from (`tokens_source`)."""
    if current.prompt is None or not lens["new"]:
        return
    new = lens["new"]
    block, estimated = _new_block_tokens(lens, context, previous, current)
    lens.update(tokens_source=current.source, new_tokens=block, new_tokens_estimated=estimated)
    if not estimated and not lens["first"] and previous is not None:
        lens["unchanged_tokens"] = previous.prompt
    if len(new) == 1:
        new[0].update(tokens=block, tokens_estimated=estimated)
        return
    counts = _share_tokens(new, block, previous.completion if previous else None)
    for message, count in zip(new, counts, strict=True):
        message.update(tokens=count, tokens_estimated=True)


def _new_block_tokens(lens: dict[str, Any], context: Sequence[MessageRecord], previous: CallTokens | None,
                      current: CallTokens) -> tuple[int, bool]:
    prompt = current.prompt or 0
    if lens["first"]:
        return prompt, False
    extends = not lens["rewrites"] and lens["unchanged"] == lens["previous_total"]
    if extends and previous is not None and previous.prompt is not None and prompt >= previous.prompt:
        return prompt - previous.prompt, False
    everything = sum(_record_chars(m) for m in context)
    share = sum(_record_chars(context[m["index"]]) for m in lens["new"])
    return (round(prompt * share / everything) if everything else round(prompt * len(lens["new"]) / len(context))), True


def _record_chars(message: MessageRecord) -> int:
    return len(message.content) + (len(json.dumps(message.tool_calls)) if message.tool_calls else 0)


def _share_tokens(new: list[dict[str, Any]], block: int, reply_tokens: int | None) -> list[int]:
    """`block` tokens split over the new messages: a leading assistant message (the previous call's reply)
    gets `reply_tokens` when that fits, the rest goes by characters, rounded so the counts add up."""
    counts = [0] * len(new)
    start = 0
    if new and new[0]["role"] == "assistant" and reply_tokens is not None and reply_tokens <= block:
        counts[0], block, start = reply_tokens, block - reply_tokens, 1
    weights = [max(1, _message_chars(m)) for m in new[start:]]
    raw = [block * weight / sum(weights) for weight in weights]
    shares = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - shares[i], reverse=True)[: block - sum(shares)]:
        shares[i] += 1
    counts[start:] = shares
    return counts


def _message_chars(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls") or ()
    return len(message.get("content") or "") + sum(len(c["name"]) + len(c["arguments"]) for c in calls)


# ---------------------------------------------------------------- the run's index (timeline, filters, jumps)

INDEX_KINDS = ("model_call", "message", "tool_call", "command", "observation", "file_change", "eval",
               "sandbox_event", "note")
FAILED, EDIT = 1, 2  # bits of an index entry's flags
_EDIT_TOOLS = re.compile(r"(?i)edit|write|replace|str_replace|apply_patch|patch|insert|create")


def step_index(rows: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """The run in columns, one entry per step: `seq`, `kind` (an index into `kinds`), `start` (ms from the
    run's first timestamp, or null), `dur` (ms, or null), `flags` (FAILED, EDIT), `value` (the value estimate,
    when any step has one), `timed` (whether steps carry timestamps), and `marks`: the seqs of the first
    failure, the first edit and the evaluations. Rows: (seq, kind, start as epoch ms (its start, else its
    end), duration ms (stored, else its span), is_error, exit_code, value_estimate, tool name, payload
    success, payload score value); times come as numbers so a 30,000-step run parses no datetimes."""
    rows = list(rows)
    origin = min((row[2] for row in rows if row[2] is not None), default=None)
    kind_codes = {kind: code for code, kind in enumerate(INDEX_KINDS)}
    other = len(INDEX_KINDS) - 1
    seqs, kinds, starts, durations, all_flags, values = [], [], [], [], [], []
    marks: dict[str, Any] = {"first_error": None, "first_edit": None, "evals": []}
    for seq, kind, start, duration, is_error, exit_code, value, tool, success, score in rows:
        flags = 0
        if is_error or (exit_code is not None and exit_code != 0):
            flags = FAILED
        elif kind == "eval" and _passed({"success": success}, score, None, exit_code) is False:
            flags = FAILED
        if kind == "file_change" or (kind == "tool_call" and isinstance(tool, str) and _EDIT_TOOLS.search(tool)):
            flags |= EDIT
        seqs.append(seq)
        kinds.append(kind_codes.get(kind, other))
        starts.append(None if start is None else round(start - origin, 1))
        durations.append(None if duration is None else round(max(0.0, duration), 1))
        all_flags.append(flags)
        values.append(None if value is None else round(value, 4))
        if flags:
            _mark(marks, seq, flags)
        if kind == "eval":
            marks["evals"].append(seq)
    return {"n": len(rows), "kinds": list(INDEX_KINDS), "seq": seqs, "kind": kinds, "start": starts,
            "dur": durations, "flags": all_flags, "value": None if all(v is None for v in values) else values,
            "timed": origin is not None, "marks": marks}


def _mark(marks: dict[str, Any], seq: int, flags: int) -> None:
    if flags & FAILED and marks["first_error"] is None:
        marks["first_error"] = seq
    if flags & EDIT and marks["first_edit"] is None:
        marks["first_edit"] = seq
