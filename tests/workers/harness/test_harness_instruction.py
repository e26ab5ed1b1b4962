"""How an external harness gets the task's instruction: written by its own script, in the harness's exec
(no round trip before it), byte for byte and never run; an instruction too long for one `bash -c` argument
is staged as a file first and moved out of the workspace. In a real sandbox (the local backend)."""

from __future__ import annotations

import hashlib

from workers.demo.tasks import get_demo_task
from workers.harness.external import (
    INLINE_INSTRUCTION_BYTES,
    INSTRUCTION_FILE,
    STAGED_INSTRUCTION,
    HarnessSetup,
    run_external_harness,
)

SETUP = HarnessSetup(base_url="http://127.0.0.1:18080/r/tok/v1", model="policy-7", seed=3)
# Everything a shell could make something of: quotes, expansions, a command substitution that would leave
# a file behind if it ran, backslashes, a trailing newline and non-ASCII text.
HOSTILE = ("Fix it.\n'single' \"double\" $HOME ${PATH} `id` $(touch /tmp/trove/ran) \\n \\\\ \t end -- é ✓\n"
           "EOF\nTROVE_CONFIG_EOF\n")


def run(executor, instruction: str) -> tuple[bool, list[str]]:
    """Whether the harness read exactly the instruction from its file, and the files staged into the
    workspace."""
    staged: list[str] = []

    def stage_file(path: str, text: str) -> None:
        staged.append(path)
        executor.backend.write_file(executor.handle, path, text.encode())

    outcome = run_external_harness(
        command=f'test "$TROVE_INSTRUCTION_FILE" = {INSTRUCTION_FILE} && sha256sum < "$TROVE_INSTRUCTION_FILE"',
        instruction=instruction, setup=SETUP, stage_file=stage_file, execute=executor, kill=executor,
        should_stop=lambda: False)
    assert outcome.result.exit_code == 0, outcome.result.stderr
    return outcome.result.stdout.split()[0] == hashlib.sha256(instruction.encode()).hexdigest(), staged


def test_the_instruction_reaches_the_harness_byte_for_byte_in_its_own_exec_and_nothing_in_it_runs(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))

    exact, staged = run(executor, HOSTILE)

    assert exact
    assert staged == [], "no write into the sandbox before the harness's exec"
    assert not executor.exists("/tmp/trove/ran"), "the instruction's command substitution never ran"
    assert not executor.exists(STAGED_INSTRUCTION), "nothing of it in the workspace (so none in the diff)"


def test_an_instruction_too_long_for_one_argument_is_staged_then_moved_out_of_the_workspace(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))
    long = HOSTILE * (INLINE_INSTRUCTION_BYTES // len(HOSTILE.encode()) + 1)
    assert len(long.encode()) > INLINE_INSTRUCTION_BYTES

    exact, staged = run(executor, long)

    assert exact
    assert staged == [STAGED_INSTRUCTION]
    assert not executor.exists(STAGED_INSTRUCTION)
    assert not executor.exists("/tmp/trove/ran")


def test_an_instruction_whose_quoting_would_overflow_the_argument_is_staged_though_short(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))
    # shlex.quote turns every single quote into five characters: short text, a script over the limit.
    instruction = "'" * (INLINE_INSTRUCTION_BYTES // 2)

    exact, staged = run(executor, instruction)

    assert exact and staged == [STAGED_INSTRUCTION]


def test_an_instruction_holding_a_nul_byte_is_staged_as_a_file_since_no_argument_can_hold_one(task_workspace):
    executor = task_workspace(get_demo_task("slugify"))
    instruction = "before\x00after"

    exact, staged = run(executor, instruction)

    assert exact and staged == [STAGED_INSTRUCTION]
