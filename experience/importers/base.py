"""Shared reading helpers for the importers: JSON and JSONL with clear errors, typed field access,
timestamps, chat-message conversion and tool-call normalisation.

Conventions every importer follows (so the store sees one vocabulary whatever the source):
- tool calls are OpenAI-shaped: {"id", "type": "function", "function": {"name", "arguments": <JSON text>}};
- a `message` step has payload["role"]; a `model_call` keeps the reply in `response_text` and any separate
  reasoning / thought in `text`;
- timestamps are timezone-aware; a source that writes naive local times is read as UTC and the record says
  so in metadata["naive_timestamps_read_as_utc"];
- run totals the source reports but cannot split per step go to metadata["usage"]
  ({"tokens_in", "tokens_out", "api_calls"});
- payload never uses the names the store keeps as step columns or blobs (see RESERVED_PAYLOAD_KEYS).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from experience.importers.errors import ImportFormatError, ImportValidationError
from experience.importers.limits import JsonTooDeep, loads_json
from experience.records import MessageRecord, StepRecord

HEAD_BYTES = 1 << 20  # detection reads at most this much of a file
TAIL_BYTES = 4096

# Step payload keys the store already uses for step fields (experience.steps); a payload must not shadow them.
RESERVED_PAYLOAD_KEYS = frozenset(
    {"text", "output", "response_text", "command", "tool_calls", "model", "latency_ms", "ttft_ms"}
)

# Tool names whose call is a shell command, and the argument that holds the command line.
SHELL_TOOLS = frozenset(
    {"bash", "execute_bash", "shell", "run_shell_command", "terminal", "run_command", "exec", "bash_command"}
)
SHELL_ARGUMENTS = ("command", "cmd", "keystrokes")  # keystrokes: Terminus (Harbor) sends keys to a tmux shell

_DIFF_START = re.compile(r"^\s*(diff --git |--- |Index: )", re.MULTILINE)


@dataclass(frozen=True)
class Location:
    """Where in a file a run comes from; builds the typed errors that name it."""

    path: Path
    line: int | None = None
    record: int | None = None

    def invalid(self, field: str | None, problem: str) -> ImportValidationError:
        text = f"field '{field}' {problem}" if field else problem
        return ImportValidationError(self.path, text, line=self.line, record=self.record, field=field)

    def malformed(self, problem: str) -> ImportFormatError:
        return ImportFormatError(self.path, problem, line=self.line, record=self.record)


# ---------------------------------------------------------------- reading files


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(size)


def read_tail(path: Path, size: int = TAIL_BYTES) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        end = handle.tell()
        handle.seek(max(0, end - size))
        return handle.read()


def first_line(head: bytes) -> bytes:
    return head.lstrip().split(b"\n", 1)[0]


def first_json_line(head: bytes) -> Any:
    """The first line of `head` parsed as JSON, or None when it is not complete JSON (too long, not JSON)."""
    try:
        return loads_json(first_line(head))
    except ValueError:  # JsonTooDeep too: the parse that follows detection names it
        return None


def load_json_document(path: Path) -> Any:
    """Parse a whole JSON file. A cut or corrupted file raises ImportFormatError with the position."""
    data = path.read_bytes()
    return parse_json_bytes(data, Location(path))


def parse_json_bytes(data: bytes, loc: Location) -> Any:
    try:
        return loads_json(data)
    except JsonTooDeep as exc:
        raise loc.malformed(f"{exc} (refused: the limit guards the importer)") from None
    except UnicodeDecodeError as exc:
        raise loc.malformed(f"not UTF-8 text at byte {exc.start} (corrupted file?)") from None
    except json.JSONDecodeError as exc:
        # a JSON document ends with its closing bracket; one that does not, or that the parser found still
        # open at its last byte (cut just after an inner bracket), was cut short
        end = len(data.rstrip())
        truncated = not data.rstrip().endswith((b"}", b"]")) or exc.pos >= end
        hint = " (the file ends early: truncated?)" if truncated else " (corrupted?)"
        raise loc.malformed(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{hint}"
        ) from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) for each non-blank line, reading one line at a time."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            ends_file = not raw.endswith(b"\n")
            try:
                yield number, loads_json(raw)
            except JsonTooDeep as exc:
                raise ImportFormatError(path, f"{exc} (refused: the limit guards the importer)", line=number) from None
            except UnicodeDecodeError:
                raise ImportFormatError(path, "not UTF-8 text (corrupted file?)", line=number) from None
            except json.JSONDecodeError as exc:
                hint = " (the file ends mid-line: truncated?)" if ends_file else " (corrupted?)"
                raise ImportFormatError(
                    path, f"invalid JSON at column {exc.colno}: {exc.msg}{hint}", line=number
                ) from None


def ref_name(path: Path, name: str | None) -> str:
    """The file's name inside a source_ref: the caller's name (a path relative to an import root) or
    the parent folder and file name, which for harness output folders names the run configuration."""
    if name:
        return name
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


class UniqueRefs:
    """Hands out run identities unique within one file: a repeated id gets '~2', '~3', ..."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def take(self, ref: str) -> str:
        count = self._seen.get(ref, 0) + 1
        self._seen[ref] = count
        return ref if count == 1 else f"{ref}~{count}"


# ---------------------------------------------------------------- typed field access

_TYPE_NAMES = {
    dict: "an object",
    list: "a list",
    str: "text",
    int: "an integer",
    float: "a number",
    bool: "true/false",
}


def require(obj: Any, key: str, kind: type | tuple[type, ...], loc: Location, *, prefix: str = "") -> Any:
    field = prefix + key
    if not isinstance(obj, dict):
        raise loc.invalid(prefix.rstrip(".") or None, "must be an object")
    if key not in obj or obj[key] is None:
        raise loc.invalid(field, "missing")
    return _typed(obj[key], kind, field, loc)


def optional(obj: Any, key: str, kind: type | tuple[type, ...], loc: Location, *, prefix: str = "") -> Any:
    if not isinstance(obj, dict) or obj.get(key) is None:
        return None
    return _typed(obj[key], kind, prefix + key, loc)


def _typed(value: Any, kind: type | tuple[type, ...], field: str, loc: Location) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a count or a cost given as true/false is a fault in the file
    if isinstance(value, bool) and bool not in kinds:
        raise loc.invalid(field, f"must be {_type_name(kinds)}, got true/false")
    if float in kinds and isinstance(value, int):
        return value
    if not isinstance(value, kinds):
        raise loc.invalid(field, f"must be {_type_name(kinds)}, got {type(value).__name__}")
    return value


def _type_name(kinds: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def text_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ""


def count_or_none(value: Any) -> int | None:
    """A token count: a non-negative int (floats that are whole numbers accepted), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value < 0 or value != int(value):
        return None
    return int(value)


def number_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# ---------------------------------------------------------------- time


def parse_time(value: Any, loc: Location, field: str) -> datetime | None:
    """ISO 8601 text or a Unix time in seconds. Naive times are read as UTC (see module docstring)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise loc.invalid(field, "must be a time, got true/false")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC)
    if not isinstance(value, str):
        raise loc.invalid(field, f"must be a time, got {type(value).__name__}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise loc.invalid(field, f"{value!r} is not an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def is_naive_time(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return datetime.fromisoformat(value).tzinfo is None
    except ValueError:
        return False


def before(moment: datetime | None, milliseconds: float | None) -> datetime | None:
    if moment is None or milliseconds is None:
        return None
    return moment - timedelta(milliseconds=milliseconds)


def seconds_to_ms(value: Any) -> float | None:
    seconds = number_or_none(value)
    return None if seconds is None else seconds * 1000.0


# ---------------------------------------------------------------- text and messages


def content_text(content: Any) -> str:
    """Text of a chat message's content: a string, or a list of parts (OpenAI, Anthropic, Inspect)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return _part_text(content)
    if isinstance(content, list):
        return "\n".join(text for text in (_part_text(p) for p in content) if text)
    return json.dumps(content, ensure_ascii=False)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    kind = part.get("type")
    if kind in (None, "text", "input_text", "output_text") and isinstance(part.get("text"), str):
        return part["text"]
    if kind in ("image", "image_url", "input_image"):
        return "[image]"
    return ""


def reasoning_text(content: Any) -> str:
    """Reasoning parts of a content list (Inspect, Anthropic thinking), joined."""
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("reasoning", "thinking"):
            value = part.get("reasoning") or part.get("thinking") or part.get("text")
            if isinstance(value, str) and value:
                texts.append(value)
    return "\n".join(texts)


def side_reasoning(message: dict[str, Any]) -> str:
    """Reasoning a provider returns beside the content rather than in it: `reasoning_content` (DeepSeek, and
    Gemini through LiteLLM), `reasoning` (OpenRouter), `thinking` text, or LiteLLM's `thinking_blocks`."""
    for key in ("reasoning_content", "reasoning", "thinking"):
        if isinstance(message.get(key), str) and message[key]:
            return message[key]
    blocks = [b.get("thinking") for b in message.get("thinking_blocks") or [] if isinstance(b, dict)]
    return "\n".join(t for t in blocks if isinstance(t, str) and t)


def openai_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """One tool call in OpenAI shape. Arguments given as text are kept verbatim."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    call: dict[str, Any] = {"type": "function", "function": {"name": str(name or ""), "arguments": arguments}}
    if call_id is not None:
        call = {"id": str(call_id), **call}
    return call


def normalise_tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    """OpenAI, Inspect ({id, function: "name", arguments: {...}}) or Anthropic tool_use calls, as OpenAI."""
    if not isinstance(calls, list) or not calls:
        return None
    normalised = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if isinstance(function, dict):
            normalised.append(
                openai_tool_call(call.get("id"), function.get("name"), function.get("arguments"))
            )
        elif isinstance(function, str):
            normalised.append(openai_tool_call(call.get("id"), function, call.get("arguments")))
        elif "name" in call:
            normalised.append(
                openai_tool_call(call.get("id"), call["name"], call.get("input", call.get("arguments")))
            )
    return normalised or None


def tool_call_parts(call: dict[str, Any]) -> tuple[str | None, str, Any]:
    """(id, name, parsed arguments) of an OpenAI-shaped call; unparseable arguments stay text."""
    function = as_dict(call.get("function"))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = loads_json(arguments)
        except ValueError:  # not JSON, or too deep to walk: the arguments stay text
            pass
    return call.get("id"), str(function.get("name") or ""), arguments


def shell_command(name: str, arguments: Any) -> str | None:
    """The command line when a tool call is a shell command, else None. Names match case-insensitively
    (Claude Code calls its shell tool "Bash")."""
    if name.lower() not in SHELL_TOOLS or not isinstance(arguments, dict):
        return None
    for key in SHELL_ARGUMENTS:
        if isinstance(arguments.get(key), str):
            return arguments[key]
    return None


def message_record(message: dict[str, Any]) -> MessageRecord:
    return MessageRecord(
        role=str(message.get("role") or "user"),
        content=content_text(message.get("content")),
        name=message.get("name") if isinstance(message.get("name"), str) else None,
        tool_calls=normalise_tool_calls(message.get("tool_calls")),
        tool_call_id=message.get("tool_call_id") if isinstance(message.get("tool_call_id"), str) else None,
    )


def message_step(role: str, text: str, **fields: Any) -> StepRecord:
    payload = {"role": role, **fields.pop("payload", {})}
    return StepRecord(kind="message", text=text, payload=payload, **fields)


def task_hash(instruction: str) -> str:
    """A task key for runs whose source names no task: runs given the same instruction share it."""
    return "sha256:" + hashlib.sha256(instruction.encode()).hexdigest()[:16]


def looks_like_diff(text: Any) -> bool:
    return isinstance(text, str) and bool(_DIFF_START.search(text))


def unique_call_ids(steps: list[StepRecord]) -> list[StepRecord]:
    """The store keeps one step per call_id within a run; a source that repeats an id keeps the first."""
    seen: set[str] = set()
    for step in steps:
        if step.call_id is None:
            continue
        if step.call_id in seen:
            step.payload.setdefault("repeated_call_id", step.call_id)
            step.call_id = None
        else:
            seen.add(step.call_id)
    return steps


def sum_counts(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None
