"""What makes two runs "the same": the normalised actions, not what the environment said back.

Choices, and why:

- **Actions only.** A run's identity is what the agent *did*: shell commands (`command` steps) and
  structured tool calls (`tool_call` steps), in order. Observations, thoughts and model calls are left out:
  they carry timestamps, memory addresses, temp paths and prose that differ between otherwise identical
  runs. Tool calls recorded only inside `model_call` steps are used when a run has no `command` or
  `tool_call` step at all (a proxy recording holds nothing else). `file_change` steps are effects, not
  actions; the final diff stands for them in the signature text.
- **Normalisation** removes what changes between two executions of the same plan: line endings, runs of
  whitespace (indentation included — a re-indented edit is the same edit for dedup), quotes around a
  whole word without spaces (`open "a.py"` is `open a.py`; `f(x="a")` keeps its quotes), per-run temp
  directories (`/tmp/tmpab12/x` → `<TMP>/x`), home directories (→ `~`), UUIDs and hex ids of 7+
  characters mixing letters and digits (commit SHAs, container ids, md5s → `<HEX>`), and line numbers
  where they only position an editor window or range (`edit 12:14`, `sed -n 10,20p`, `file.py:88`,
  `open f.py 1474`, `goto 50`, `head -n 20`, tool arguments named like `view_range` / `start_line`).
  Plain numbers elsewhere stay: `submit 125379498` is an answer. A repository root written out
  (`/SWE-agent__test-repo/tests/x.py` against `tests/x.py`) is not recognised: the near-duplicate
  search absorbs that.
- **The exact hash** is sha256 over a versioned JSON of `[task_key, actions]`, so runs of different tasks
  never share a hash, and a change of the rules (bump `SIGNATURE_VERSION`) never matches old hashes. A run
  with no actions has no hash (`NO_SIGNATURE`, the empty string): "nothing done" is not evidence that
  two runs did the same thing (a run whose actions were not recorded as actions, one that crashed at
  once and one that was handed a task already solved would all share it), so such a run is never an
  exact duplicate, and dedup does not place it in a cluster by its (empty) action list either.
- **The signature text** (input to the embedders) is the task head (task key and the first ~200 characters
  of the instruction), the ordered actions, each capped so one long edit cannot crowd out the rest, and
  the final diff reduced to its file headers and changed lines (context lines and `index` / hunk line
  numbers depend on the checkout, not on the run). Sections have fixed budgets so the diff survives a long
  action list; the whole is at most `max_chars`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from experience.records import StepRecord, TrajectoryRecord

SIGNATURE_VERSION = 1
TASK_HEAD_CHARS = 200
ACTION_CHARS = 160
# The step kinds a signature and the exact hash read: observations stay unread, so loaders can skip them.
ACTION_KINDS = ("command", "tool_call", "model_call")
DEFAULT_SIGNATURE_CHARS = 2000
NO_SIGNATURE = ""  # the exact hash of a run with no actions: matches nothing

_TEMP_DIR = re.compile(
    r"(?<![\w.~-])(?:/private)?(?:/var/folders/[^/\s'\"]+/[^/\s'\"]+/[A-Z]|/var/tmp|/tmp|/dev/shm)/[^/\s'\"]+"
)
_HOME_DIR = re.compile(r"(?<![\w.~-])(?:/home/[^/\s'\"]+|/Users/[^/\s'\"]+|/root)(?=/|\s|$|['\"])")
_UUID = re.compile(
    r"(?i)(?<![0-9a-z])[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![0-9a-z])"
)
# Needs a digit and a letter so words like `deadbeef`, `facade` or a decimal answer survive.
_HEX_ID = re.compile(r"(?i)(?<![0-9a-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,}(?![0-9a-z])")
_LINE_RANGE = re.compile(r"(?<![\w.])\d+(\s*):(\s*)\d+(?![\w.])")
_SED_RANGE = re.compile(r"(?<![\w.])\d+,\d+([pd])\b")
_FILE_LINE = re.compile(r"(\.[A-Za-z0-9]+):\d+\b")
_HEAD_TAIL = re.compile(r"\b(head|tail)(\s+-n\s*|\s+-)\d+\b")
_QUOTED_TOKEN = re.compile(r"(?<!\S)([\"'])([^\s\"'\\]+)\1(?!\S)")
_WHITESPACE = re.compile(r"\s+")
_BARE_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
# Editor commands (SWE-agent and friends) whose numeric arguments only move a window or a cursor.
_WINDOW_COMMANDS = frozenset({"open", "goto", "scroll_up", "scroll_down", "set_cursors", "view"})
_LINE_ARG = re.compile(r"(?i)line|range|start|end|offset|limit|cursor|window")


def action_sequence(record: TrajectoryRecord) -> list[str]:
    """The run's actions in order, each normalised (see the module docstring). Observations are out."""
    actions = [action for step in record.steps for action in _step_actions(step)]
    if actions:
        return actions
    return [
        _normalise_tool_call(call)
        for step in record.steps
        if step.kind == "model_call"
        for call in step.tool_calls or []
    ]


def exact_hash(record: TrajectoryRecord, *, actions: list[str] | None = None) -> str:
    """sha256 hex of the task key and the normalised action sequence; equal for exact duplicates.

    `NO_SIGNATURE` (empty) for a run with no actions: it is nobody's exact duplicate. Pass `actions`
    (from `action_sequence`) when the caller also builds the signature text, to normalise once.
    """
    actions = action_sequence(record) if actions is None else actions
    if not actions:
        return NO_SIGNATURE
    payload = json.dumps(
        [f"trove-actions-v{SIGNATURE_VERSION}", record.task_key, actions],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def signature_text(
    record: TrajectoryRecord, max_chars: int = DEFAULT_SIGNATURE_CHARS, *, actions: list[str] | None = None
) -> str:
    """A short text for embedding: task head, numbered normalised actions, the diff's changed lines."""
    actions = action_sequence(record) if actions is None else actions
    head = _task_head(record)
    diff = "\n".join(diff_essence(record.final_diff))
    diff_budget = min(len(diff), max_chars // 4)
    action_budget = max(0, max_chars - len(head) - diff_budget - len("\nactions:\n\ndiff:\n"))
    listed = _clip_lines(_numbered(actions), action_budget)
    text = f"{head}\nactions:\n{listed}\ndiff:\n{diff[:diff_budget]}"
    return text[:max_chars]


@functools.lru_cache(maxsize=65536)  # runs repeat the same commands (`ls -F`, `submit`) endlessly
def normalise_action(text: str) -> str:
    """One shell command or tool invocation, rewritten so incidental differences disappear."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    text = _normalise_paths_and_ids(text)
    text = _normalise_line_numbers(text)
    if "'" in text or '"' in text:
        text = _QUOTED_TOKEN.sub(r"\2", text)
    return _WHITESPACE.sub(" ", text).strip()


def diff_essence(diff: str) -> Iterator[str]:
    """File headers and changed lines of a unified diff, whitespace-collapsed; context dropped.

    A submission that is not a diff (a CTF flag, an answer) is kept whole, line by line.
    """
    lines = diff.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if not any(line.startswith(("diff --git", "+++ ", "--- ", "@@")) for line in lines):
        yield from (_WHITESPACE.sub(" ", line).strip() for line in lines if line.strip())
        return
    for line in lines:
        if line.startswith(("+++ ", "--- ")):
            yield _WHITESPACE.sub(" ", _normalise_paths_and_ids(line)).strip()
        elif line.startswith(("+", "-")) and line[1:].strip():
            yield line[0] + _WHITESPACE.sub(" ", line[1:]).strip()


def _step_actions(step: StepRecord) -> list[str]:
    if step.kind == "command":
        text = step.command if step.command is not None else step.text
        return [normalise_action(text)] if text and text.strip() else []
    if step.kind == "tool_call":
        if step.tool_calls:
            return [_normalise_tool_call(call) for call in step.tool_calls]
        return [normalise_action(step.text)] if step.text.strip() else []
    return []


def _normalise_tool_call(call: dict[str, Any]) -> str:
    """`name key=value ...` with keys sorted; accepts OpenAI (`function.arguments` JSON) and flat shapes."""
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
    name = str(function.get("name") or call.get("type") or "tool")
    arguments = function.get("arguments", function.get("input", function.get("args", {})))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return normalise_action(f"{name} {arguments}")
    if not isinstance(arguments, dict):
        return normalise_action(f"{name} {json.dumps(arguments, sort_keys=True)}")
    parts = [f"{key}={_normalise_argument(key, arguments[key])}" for key in sorted(arguments)]
    return normalise_action(" ".join([name, *parts]))


def _normalise_argument(key: str, value: Any) -> str:
    if _LINE_ARG.search(key) and _is_integral(value):
        return "<N>"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _is_integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, list) and bool(value) and all(_is_integral(item) for item in value)


# Each rule runs only when a cheap substring test says it could match: most actions need none of them.
def _normalise_paths_and_ids(text: str) -> str:
    if "/tmp/" in text or "/var/" in text or "/dev/shm/" in text:
        text = _TEMP_DIR.sub("<TMP>", text)
    if "/home/" in text or "/Users/" in text or "/root" in text:
        text = _HOME_DIR.sub("~", text)
    if "-" in text:
        text = _UUID.sub("<UUID>", text)
    return _HEX_ID.sub("<HEX>", text)


def _normalise_line_numbers(text: str) -> str:
    if ":" in text:
        text = _LINE_RANGE.sub(r"<N>\1:\2<N>", text)
        text = _FILE_LINE.sub(r"\1:<N>", text)
    if "," in text:
        text = _SED_RANGE.sub(r"<N>,<N>\1", text)
    if "head" in text or "tail" in text:
        text = _HEAD_TAIL.sub(r"\1\2<N>", text)
    first_line, newline, rest = text.partition("\n")
    words = first_line.split(None, 1)
    if words and words[0] in _WINDOW_COMMANDS:
        first_line = _BARE_NUMBER.sub("<N>", first_line)
    return first_line + newline + rest


def _task_head(record: TrajectoryRecord) -> str:
    instruction = _WHITESPACE.sub(" ", record.instruction).strip()[:TASK_HEAD_CHARS]
    return f"task: {record.task_key}\n{instruction}"


def _numbered(actions: Iterable[str]) -> Iterator[str]:
    for number, action in enumerate(actions, start=1):
        clipped = action if len(action) <= ACTION_CHARS else action[: ACTION_CHARS - 1] + "…"
        yield f"{number}. {clipped}"


def _clip_lines(lines: Iterable[str], budget: int) -> str:
    """Whole lines while they fit, so the budget never cuts an action in half."""
    kept: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) + 1 > budget:
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)
