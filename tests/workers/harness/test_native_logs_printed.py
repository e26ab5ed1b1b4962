"""A preset's native logs printed by its own script after the harness exits (no exec of their own), split
off the harness's output; read with an exec when they are not there whole. The script runs in a real
sandbox (the local backend), with a stand-in for the harness binary."""

from __future__ import annotations

import base64
import shlex
from datetime import UTC, datetime

from workers.demo.tasks import get_demo_task
from workers.harness.external import ExternalOutcome, HarnessSetup, harness_env, harness_script
from workers.harness.presets import CATALOGUE
from workers.harness.presets.launch import HARNESS_REDIRECTS, LOGS_END, LOGS_START, launch
from workers.harness.presets.rollout import harness_exec_output_bytes, split_harness_output
from workers.sandboxes.base import ExecResult

SETUP = HarnessSetup(base_url="http://127.0.0.1:18080/r/tok/v1", model="policy-7", seed=3)
SESSION = "home/.claude/projects/-workspace/s1.jsonl"
CAP = 4096  # the harness's own output cap in these tests


def with_stand_in(harness: str) -> str:
    """Claude Code's launch script with its harness line replaced by `harness` (a bash script)."""
    script = launch(CATALOGUE["claude-code"], "2.1.197", SETUP).script
    lines = script.split("\n")
    at = next(i for i, line in enumerate(lines) if line.endswith(HARNESS_REDIRECTS))
    lines[at] = f"bash -c {shlex.quote(harness)} {HARNESS_REDIRECTS}"
    return "\n".join(lines)


def run_in_sandbox(executor, harness: str, *, timeout: float = 60) -> tuple[ExternalOutcome, dict[str, bytes] | None]:
    executor.backend.write_file(executor.handle, ".trove-instruction.md", b"Fix it.")
    script = harness_script(with_stand_in(harness), harness_env(SETUP))
    result = executor.backend.exec(executor.handle, script, timeout=timeout, max_output=harness_exec_output_bytes(CAP))
    now = datetime.now(UTC)
    return split_harness_output(ExternalOutcome(result=result, started_at=now, ended_at=now), CAP)


def test_the_logs_printed_after_the_harness_are_split_off_its_output_which_is_left_as_it_printed_it(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))
    harness = (f"mkdir -p /tmp/trove/{SESSION.rsplit('/', 1)[0]} && printf '{{\"a\":1}}\\n' > /tmp/trove/{SESSION}; "
               # a harness that prints the markers itself forges nothing: the script's own come last
               f"printf 'done\\n{LOGS_START}\\nbogus\\n{LOGS_END}\\nno newline at the end'; echo oops >&2; exit 3")

    outcome, files = run_in_sandbox(executor, harness)

    assert files == {SESSION: b'{"a":1}\n'}
    assert outcome.result.stdout == f"done\n{LOGS_START}\nbogus\n{LOGS_END}\nno newline at the end"
    assert outcome.result.stderr == "oops\n"
    assert outcome.result.exit_code == 3, "the harness's exit status, not the collection's"
    assert outcome.result.truncated_bytes == 0


def test_logs_larger_than_a_pipe_come_through_after_a_harness_that_made_its_stdout_non_blocking(task_workspace):
    """Node and Bun set O_NONBLOCK on their stdout, the exec pipe's shared description: the script's own
    writes after such a harness failed with EAGAIN past 64 KiB, and the logs needed an exec of their own."""
    executor = task_workspace(get_demo_task("slugify"))
    folder = f"/tmp/trove/{SESSION.rsplit('/', 1)[0]}"
    harness = ("python3 -c 'import fcntl, os; fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)'"
               f" && mkdir -p {folder} && head -c 300000 /dev/urandom > /tmp/trove/{SESSION} && echo done")

    outcome, files = run_in_sandbox(executor, harness)

    assert files is not None, "printed whole, not left for an exec"
    assert len(files[SESSION]) == 300000 and outcome.result.stdout == "done\n"
    assert outcome.result.exit_code == 0


def test_a_daemon_the_harness_left_holding_its_output_does_not_keep_the_script_from_ending(task_workspace):
    """The script waits for the cats that copy the harness's output on, but not for a process the harness
    left behind that still holds its pipe: it ends, with the harness's output and status and the logs."""
    executor = task_workspace(get_demo_task("slugify"))
    harness = (f"mkdir -p /tmp/trove/{SESSION.rsplit('/', 1)[0]} && echo kept > /tmp/trove/{SESSION}; "
               "(sleep 120 &); echo done; exit 4")

    outcome, files = run_in_sandbox(executor, harness, timeout=60)

    assert not outcome.result.timed_out, "the script waited for the harness's daemon"
    assert (outcome.result.exit_code, outcome.result.stdout, files) == (4, "done\n", {SESSION: b"kept\n"})


def test_a_harness_that_left_no_log_prints_none_and_needs_no_exec(task_workspace):
    outcome, files = run_in_sandbox(task_workspace(get_demo_task("slugify")), "echo hi")

    assert (files, outcome.result.stdout, outcome.result.exit_code) == ({}, "hi\n", 0)


def test_the_harnesss_own_output_is_still_cut_at_its_cap_though_the_exec_had_room_for_the_logs(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))

    outcome, files = run_in_sandbox(executor, f"head -c {CAP + 100} /dev/zero | tr '\\0' x; head -c {CAP + 7} "
                                              "/dev/zero | tr '\\0' y >&2")

    assert files == {}
    assert outcome.result.stdout == "x" * CAP and outcome.result.stderr == "y" * CAP
    assert outcome.result.truncated_bytes == 107


def outcome_of(stdout: str, *, truncated: int = 0) -> ExternalOutcome:
    now = datetime.now(UTC)
    return ExternalOutcome(result=ExecResult(0, stdout, "", 5.0, truncated_bytes=truncated), started_at=now,
                           ended_at=now)


def test_logs_cut_by_the_output_cap_or_garbled_are_left_for_an_exec_to_read():
    whole = base64.b64encode(b"not a gzip archive").decode()
    for printed in (f"out\n{LOGS_START}\nH4sIAAAA",  # cut before the end marker
                    f"out\n{LOGS_START}\n{whole}\n{LOGS_END}\n"):  # not an archive
        outcome, files = split_harness_output(outcome_of(printed), CAP)

        assert (outcome.result.stdout, files) == ("out", None)


def test_a_harness_stopped_before_its_script_printed_anything_keeps_its_output_and_gets_an_exec():
    outcome, files = split_harness_output(outcome_of("partial output"), CAP)

    assert (outcome.result.stdout, files) == ("partial output", None)
