"""The built-in harness: a bash-acting loop (model call -> one command -> exec -> observation).

The loop is pure: the model (`chat`) and the sandbox (`execute`) are injected, so the same code runs
against a real sandbox in a worker and against a subprocess in tests. It records nothing itself: model
calls are recorded by the proxy, and the caller records commands through the `on_command` hook.

Reply parse rule (`parse_reply`):
- Fenced blocks are found line-wise: an opening line ```` ```lang ```` and a closing line ```` ``` ````.
  Blocks tagged `bash`, `sh`, `shell`, `console`, `zsh` or untagged are command blocks; others (```python,
  ```diff ...) are prose to the harness and never run.
- The reply is a *submit* if it has a line that is exactly `TROVE_SUBMIT` outside code blocks, a
  ```` ```submit ```` block, or a command block whose whole body is `TROVE_SUBMIT`. Submit wins over any
  command in the same reply: the model said it is done, and nobody would read that command's output.
- Otherwise the first non-empty command block is the command. Extra command blocks are not run; the
  observation says so.
- Otherwise the reply has no command: the harness answers with a corrective user message, and the turn
  still counts as a step (it cost a model call).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from workers.harness.chat import ChatFn, ChatReply, ModelCallError, openai_chat
from workers.sandboxes.base import ExecResult, SandboxError

__all__ = [
    "FINISH_MARKER",
    "SYSTEM_PROMPT",
    "ChatReply",
    "HarnessOutcome",
    "ModelCallError",
    "ParsedReply",
    "format_observation",
    "instruction_message",
    "openai_chat",
    "parse_reply",
    "run_builtin_harness",
]

FINISH_MARKER = "TROVE_SUBMIT"
DEFAULT_MAX_OBSERVATION_CHARS = 10_000

# Outcome reasons.
SUBMITTED = "submitted"
STEP_BUDGET = "step_budget"
TOKEN_BUDGET = "token_budget"
MODEL_ERROR = "model_error"
SANDBOX_ERROR = "sandbox_error"

SYSTEM_PROMPT = f"""\
You are a software engineer fixing a problem in a code repository inside a Linux sandbox without network.

Each reply must contain exactly ONE shell command in a fenced block, like this:

```bash
ls -la
```

The command runs with bash in the repository root and the next message gives you its exit code and output.
Every command starts in a new shell, so `cd` and exported variables do not carry over: chain commands with
`&&` when you need to. Commands must not be interactive (no editors, no pagers). Edit files with a short
script, for example `python3 - <<'EOF' ... EOF`. Think briefly before the command.

When the task is done (run the tests first), reply with a line containing only {FINISH_MARKER} and no command.
"""

NO_COMMAND_MESSAGE = (
    "Your reply had no command. Reply with exactly one shell command in a ```bash fenced block, "
    f"or with {FINISH_MARKER} on a line of its own when the task is done."
)

_COMMAND_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n`]*$")
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$")


@dataclass(frozen=True)
class ParsedReply:
    kind: Literal["command", "submit", "none"]
    command: str = ""
    command_blocks: int = 0  # how many command blocks the reply had (only the first runs)


@dataclass
class HarnessOutcome:
    finished: bool  # the model submitted
    reason: str  # submitted | step_budget | token_budget | model_error | sandbox_error | a should_stop reason
    steps: int  # model turns taken, including turns without a command
    commands: int  # commands executed
    messages: list[dict[str, Any]]
    seed: int | None = None
    prompt_tokens: int = 0  # summed from the replies' reported usage
    completion_tokens: int = 0
    error: str = ""
    exception: BaseException | None = field(default=None, repr=False)


OnCommand = Callable[[str, ExecResult, datetime, datetime], None]
OnMessage = Callable[[dict[str, Any]], None]


def instruction_message(instruction: str) -> str:
    return (
        "Here is the task. The repository is your current working directory.\n\n"
        f"{instruction.strip()}\n\n"
        f"Reply with one shell command per turn in a ```bash block; reply with {FINISH_MARKER} when done."
    )


def run_builtin_harness(
    *,
    instruction: str,
    chat: ChatFn,
    execute: Callable[[str], ExecResult],
    max_steps: int,
    seed: int | None = None,
    on_command: OnCommand | None = None,
    on_message: OnMessage | None = None,
    should_stop: Callable[[], str | None] | None = None,
    max_total_tokens: int | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
) -> HarnessOutcome:
    """Run the loop until the model submits or a budget ends it. Never raises for a failed model call
    (`ModelCallError`) or sandbox call (`SandboxError`): those end the run with reason `model_error` /
    `sandbox_error` and the exception on the outcome, so the caller decides about retries. Exceptions from
    the hooks propagate (a hook may raise to abort, e.g. when the lease is lost).

    `seed` is the sample's seed; it is recorded on the outcome (the chat callable sends it to the model).
    `should_stop` is checked before each model call; a non-empty string ends the run with that reason
    (time budget, lost lease). `max_total_tokens` ends it once the reported usage reaches the budget."""
    run = _Run(seed=seed, on_message=on_message)
    run.add("system", system_prompt)
    run.add("user", instruction_message(instruction))
    while run.steps < max_steps:
        stop_reason = _stop_reason(run, should_stop, max_total_tokens)
        if stop_reason:
            return run.outcome(stop_reason)
        try:
            reply = chat(list(run.messages))
        except ModelCallError as exc:
            return run.outcome(MODEL_ERROR, exc)
        run.count(reply)
        run.add("assistant", reply.content)
        parsed = parse_reply(reply.content)
        if parsed.kind == "submit":
            return run.outcome(SUBMITTED)
        if parsed.kind == "none":
            run.add("user", NO_COMMAND_MESSAGE)
            continue
        try:
            result = _execute(execute, parsed.command, on_command)
        except SandboxError as exc:
            return run.outcome(SANDBOX_ERROR, exc)
        run.commands += 1
        run.add("user", _observation(result, parsed, max_observation_chars))
    return run.outcome(STEP_BUDGET)


def parse_reply(text: str) -> ParsedReply:
    """Classify a model reply by the rule in the module docstring."""
    blocks, outside = _split_fences(text)
    command_bodies = [body for lang, body in blocks if lang in _COMMAND_LANGS and body.strip()]
    submitted = (
        any(line.strip() == FINISH_MARKER for line in outside)
        or any(lang == "submit" for lang, _ in blocks)
        or any(body.strip() == FINISH_MARKER for body in command_bodies)
    )
    if submitted:
        return ParsedReply(kind="submit", command_blocks=len(command_bodies))
    if command_bodies:
        return ParsedReply(
            kind="command", command=command_bodies[0].strip("\n"), command_blocks=len(command_bodies)
        )
    return ParsedReply(kind="none")


def format_observation(result: ExecResult, *, max_chars: int = DEFAULT_MAX_OBSERVATION_CHARS) -> str:
    """Exit code, then stdout and stderr, cut in the middle to `max_chars` in total, saying what was cut."""
    lines = [f"exit code: {result.exit_code if result.exit_code is not None else 'none (killed)'}"]
    if result.timed_out:
        lines.append(f"The command timed out after {result.duration_ms / 1000:.1f}s and was killed.")
    if result.idle_timed_out:
        lines.append("The command produced no output for too long and was killed.")
    out_budget, err_budget = _split_budget(len(result.stdout), len(result.stderr), max_chars)
    for name, text, budget in (("stdout", result.stdout, out_budget), ("stderr", result.stderr, err_budget)):
        if text:
            lines += [f"--- {name} ---", _cut_middle(text, budget)]
    if not result.stdout and not result.stderr:
        lines.append("(no output)")
    if result.truncated_bytes:
        lines.append(f"[the sandbox did not capture a further {result.truncated_bytes} bytes of output]")
    return "\n".join(lines)


class _Run:
    def __init__(self, *, seed: int | None, on_message: OnMessage | None) -> None:
        self.seed = seed
        self.messages: list[dict[str, Any]] = []
        self.steps = 0
        self.commands = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._on_message = on_message

    def add(self, role: str, content: str) -> None:
        message = {"role": role, "content": content}
        self.messages.append(message)
        if self._on_message is not None:
            self._on_message(message)

    def count(self, reply: ChatReply) -> None:
        self.steps += 1
        self.prompt_tokens += reply.usage.get("prompt_tokens", 0)
        self.completion_tokens += reply.usage.get("completion_tokens", 0)

    def outcome(self, reason: str, exc: BaseException | None = None) -> HarnessOutcome:
        return HarnessOutcome(
            finished=reason == SUBMITTED,
            reason=reason,
            steps=self.steps,
            commands=self.commands,
            messages=self.messages,
            seed=self.seed,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            error=str(exc) if exc is not None else "",
            exception=exc,
        )


def _stop_reason(
    run: _Run, should_stop: Callable[[], str | None] | None, max_total_tokens: int | None
) -> str:
    if should_stop is not None:
        reason = should_stop()
        if reason:
            return reason
    if max_total_tokens is not None and run.prompt_tokens + run.completion_tokens >= max_total_tokens:
        return TOKEN_BUDGET
    return ""


def _execute(execute: Callable[[str], ExecResult], command: str, on_command: OnCommand | None) -> ExecResult:
    started_at = datetime.now(UTC)
    result = execute(command)
    ended_at = datetime.now(UTC)
    if on_command is not None:
        on_command(command, result, started_at, ended_at)
    return result


def _observation(result: ExecResult, parsed: ParsedReply, max_chars: int) -> str:
    text = format_observation(result, max_chars=max_chars)
    if parsed.command_blocks > 1:
        text += (
            f"\n(Your reply had {parsed.command_blocks} command blocks; only the first was run. "
            "Send one command per reply.)"
        )
    return text


def _split_fences(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(blocks as (lang, body), lines outside blocks). An unclosed fence runs to the end of the text."""
    blocks: list[tuple[str, str]] = []
    outside: list[str] = []
    lang: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if lang is None:
            opening = _FENCE_OPEN.match(line)
            if opening:
                lang, body = opening.group(1).lower(), []
            else:
                outside.append(line)
        elif _FENCE_CLOSE.match(line):
            blocks.append((lang, "\n".join(body)))
            lang = None
        else:
            body.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(body)))
    return blocks, outside


def _split_budget(a: int, b: int, total: int) -> tuple[int, int]:
    """Share `total` characters between two streams: a short stream keeps all of its text."""
    if a + b <= total:
        return a, b
    half = total // 2
    if a <= half:
        return a, total - a
    if b <= half:
        return total - b, b
    return half, total - half


def _cut_middle(text: str, budget: int) -> str:
    # Keep both ends: the head shows what started, the tail holds the error and the test summary.
    if len(text) <= budget:
        return text
    head = budget // 2
    tail = budget - head
    cut = len(text) - budget
    marker = f"\n[... {cut} of {len(text)} characters cut here ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")
