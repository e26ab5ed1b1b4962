"""External harnesses: any CLI agent, run as one command inside the sandbox, its model calls recorded by the
recording proxy.

The harness gets the usual OpenAI environment, pointed at the proxy for this rollout:
    OPENAI_BASE_URL / OPENAI_API_BASE   <proxy>/r/<rollout token>/v1
    OPENAI_API_KEY                      a placeholder: the proxy holds the upstream's key, the sandbox never does
    OPENAI_MODEL / TROVE_MODEL          the job's model name
and Trove's own:
    TROVE_INSTRUCTION_FILE   the task's instruction (a file outside the workspace, so not in the final diff)
    TROVE_TASK_KEY, TROVE_ROLLOUT_ID, TROVE_SEED (the sample's seed), TROVE_MAX_STEPS, TROVE_MAX_TOKENS
Budgets other than wall time (the command's timeout) are the harness's to respect: the proxy forwards every
call it gets.

This module is pure (no Django, no sandbox): the caller injects how to write a file into the workspace,
how to run a script in the sandbox and how to kill the harness, and records what comes back.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from workers.sandboxes.base import ExecResult

SCRATCH_DIR = "/tmp/trove"  # the sandbox's private /tmp: outside the workspace, so never in the diff
INSTRUCTION_FILE = f"{SCRATCH_DIR}/instruction.md"
PID_FILE = f"{SCRATCH_DIR}/harness.pid"
STAGED_INSTRUCTION = ".trove-instruction.md"  # written into the workspace, moved to INSTRUCTION_FILE at once
# An instruction up to this size (quoted, as the script holds it) is written by the harness's own script, in the same exec: a file written
# into the sandbox first costs a round trip of its own (the lease's fence check, the agent's write, the
# event logged) before every harness. Beyond it the instruction is staged as a file: the script is one
# argument of `bash -c`, and Linux refuses an argument over 128 KiB (MAX_ARG_STRLEN).
INLINE_INSTRUCTION_BYTES = 64 * 1024
API_KEY_PLACEHOLDER = "trove-proxy"
KILL_SCRIPT = f'pid=$(cat {PID_FILE} 2>/dev/null) && [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null; true'

# How a recorded model call failed on the model server's side (not the harness's): the proxy's error kinds
# for failures the upstream could not even express as an answer, and the HTTP statuses it answered with.
TRANSPORT_FAILURES = frozenset({"upstream_timeout", "upstream_connect", "stream_broken", "malformed_stream",
                                "malformed_body"})
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
CONFIG_STATUSES = frozenset({401, 403, 404})  # wrong key or model name: retrying the rollout cannot help
# The proxy refused the job's endpoint (its address or key reference is not allowed): the same.
CONFIG_FAILURES = frozenset({"endpoint_refused"})


@dataclass(frozen=True)
class HarnessSetup:
    """What the harness is told: the endpoint, the model, the task and its budgets."""

    base_url: str  # <proxy>/r/<token>/v1 as the sandbox reaches it
    model: str
    seed: int
    task_key: str = ""
    rollout_id: int | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    api_key: str = API_KEY_PLACEHOLDER


@dataclass
class ExternalOutcome:
    result: ExecResult
    started_at: datetime
    ended_at: datetime
    cancelled: bool = False

    @property
    def reason(self) -> str:
        if self.cancelled:
            return "cancelled"
        if self.result.timed_out:
            return "wall_time"
        return "exited" if self.result.exit_code == 0 else f"exit {self.result.exit_code}"


@dataclass(frozen=True)
class ServerFailure:
    """A model call that failed on the model server's side: the run says nothing about the agent."""

    message: str
    permanent: bool = False
    call_id: str | None = field(default=None, compare=False)


def harness_env(setup: HarnessSetup) -> dict[str, str]:
    env = {
        "OPENAI_BASE_URL": setup.base_url,
        "OPENAI_API_BASE": setup.base_url,  # older clients (openai<1, litellm) read this name
        "OPENAI_API_KEY": setup.api_key,
        "OPENAI_MODEL": setup.model,
        "TROVE_MODEL": setup.model,
        "TROVE_INSTRUCTION_FILE": INSTRUCTION_FILE,
        "TROVE_TASK_KEY": setup.task_key,
        "TROVE_SEED": str(setup.seed),
    }
    optional = {"TROVE_ROLLOUT_ID": setup.rollout_id, "TROVE_MAX_STEPS": setup.max_steps,
                "TROVE_MAX_TOKENS": setup.max_tokens}
    env.update({name: str(value) for name, value in optional.items() if value is not None})
    return env


def harness_script(command: str, env: dict[str, str], instruction: str | None = None) -> str:
    """The script the sandbox runs: write the instruction to INSTRUCTION_FILE (given, with printf, a shell
    builtin: no process started; else the staged file is moved there out of the workspace), note the
    harness's pid (its process group, which a cancel kills), export the environment, then exec the harness
    command in a shell of its own (so a syntax error in it is reported as the harness's own failure)."""
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    place = (f"printf %s {shlex.quote(instruction)} > {INSTRUCTION_FILE}" if instruction is not None
             else f"mv -f {STAGED_INSTRUCTION} {INSTRUCTION_FILE}")
    return "\n".join([
        f"mkdir -p {SCRATCH_DIR} && {place} || exit 125",
        f"echo $$ > {PID_FILE}",
        f"export {exports}",
        f"exec bash -c {shlex.quote(command)}",
    ])


def run_external_harness(
    *,
    command: str,
    instruction: str,
    setup: HarnessSetup,
    stage_file: Callable[[str, str], None],
    execute: Callable[[str], ExecResult],
    kill: Callable[[str], object],
    should_stop: Callable[[], bool],
    poll_s: float = 0.2,
    kill_grace_s: float = 30.0,
    extra_env: dict[str, str] | None = None,
) -> ExternalOutcome:
    """Run `command` once in the sandbox and wait for it. `stage_file(path, text)` writes into the workspace;
    `execute(script)` runs a script there and blocks (its timeout is the wall-time budget); `kill(script)`
    runs the kill script. When `should_stop()` turns true (the rollout was cancelled or taken back), the
    harness's process group is killed and the outcome says `cancelled`. `extra_env` (a preset's) is exported
    after the usual environment and wins over it. The instruction goes in the script itself; only one whose
    quoted form is over INLINE_INSTRUCTION_BYTES is staged with `stage_file` first. Never raises for the
    harness's own failure: a non-zero exit is an outcome. Errors of `execute` (the sandbox failed) propagate."""
    inline = _fits_the_script(instruction)
    if not inline:
        stage_file(STAGED_INSTRUCTION, instruction)
    started_at = datetime.now(UTC)
    env = {**harness_env(setup), **(extra_env or {})}
    runner = Background(execute, harness_script(command, env, instruction if inline else None))
    cancelled = False
    while not runner.wait(poll_s):
        if should_stop():
            cancelled = True
            kill(KILL_SCRIPT)
            runner.wait(kill_grace_s)
            break
    result = runner.result() if runner.done else ExecResult(None, "", "", (time.monotonic() - runner.started) * 1000)
    return ExternalOutcome(result=result, started_at=started_at, ended_at=datetime.now(UTC), cancelled=cancelled)


def _fits_the_script(instruction: str) -> bool:
    # Measured as it stands in the script (quoted); a NUL byte cannot be in a process argument at all.
    return "\x00" not in instruction and len(shlex.quote(instruction).encode()) <= INLINE_INSTRUCTION_BYTES


def server_failure(*, is_error: bool, payload: dict[str, Any], call_id: str | None = None) -> ServerFailure | None:
    """Whether one recorded model call failed on the model server's side (None if it did not fail, or failed
    for the harness's own reasons: a bad request, a client that hung up)."""
    if not is_error:
        return None
    kind, status = payload.get("error_kind"), int(payload.get("status_code") or 0)
    message = f"model call failed: {payload.get('error') or f'HTTP {status}'}"
    if kind in TRANSPORT_FAILURES:
        return ServerFailure(message, call_id=call_id)
    if kind in CONFIG_FAILURES:
        return ServerFailure(message, permanent=True, call_id=call_id)
    if kind == "upstream_status" and (status >= 500 or status in TRANSIENT_STATUSES):
        return ServerFailure(message, call_id=call_id)
    if kind == "upstream_status" and status in CONFIG_STATUSES:
        return ServerFailure(message, permanent=True, call_id=call_id)
    return None


class Background:
    """`function(*args)` on a thread of its own, so the caller can do something else meanwhile (watch for
    cancellation while a harness runs). `result()` returns what it returned or raises what it raised."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.started = time.monotonic()
        self._outcome: list[Any] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(function, *args), name="trove-background",
                                        daemon=True)
        self._thread.start()

    def _run(self, function: Callable[..., Any], *args: Any) -> None:
        try:
            self._outcome.append(("ok", function(*args)))
        except BaseException as exc:  # handed to the caller's thread by result()
            self._outcome.append(("error", exc))
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def result(self) -> Any:
        self._done.wait()
        kind, value = self._outcome[0]
        if kind == "error":
            raise value
        return value
