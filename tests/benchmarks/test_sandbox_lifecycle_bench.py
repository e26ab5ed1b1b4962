"""benchmarks/sandbox_lifecycle.py's floor and leak count, against a real bubblewrap sandbox: the floor is a
real exchange with the running agent (its reply verified, so an unsigned answer cannot pass for a fast one),
and the leak count sees a stray process naming the root but not the benchmark itself, whose own command line
names the root when --root is given."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import sandbox_lifecycle  # noqa: E402

from workers.sandboxes.base import SandboxSpec  # noqa: E402


@pytest.fixture
def sandbox(local_backend):
    handle = local_backend.create(SandboxSpec(name="floor-probe"))
    yield handle
    local_backend.destroy(handle.name)


def test_the_floor_is_a_verified_exchange_with_the_running_agent(sandbox):
    assert sandbox_lifecycle.agent_floor_exec(sandbox) > 0

    with pytest.raises(RuntimeError, match="signed: False"):
        sandbox_lifecycle.agent_floor_exec(dataclasses.replace(sandbox, secret="not-the-secret"))


def test_a_command_that_does_not_print_hi_fails_the_floor(sandbox):
    with pytest.raises(RuntimeError, match="floor exec failed"):
        sandbox_lifecycle.agent_floor_exec(sandbox, "echo bye")


def test_a_stray_process_naming_the_root_is_a_leak(sandbox_root):
    stray = subprocess.Popen(["bash", "-c", "sleep 60; true", str(sandbox_root)])  # no exec: bash keeps its argv
    try:
        _wait_until_named(stray.pid, str(sandbox_root))
        leaks = sandbox_lifecycle.count_leaks(_Backend(str(sandbox_root)), [])
    finally:
        stray.kill()
        stray.wait()

    assert leaks["processes"] == 1


def _wait_until_named(pid: int, text: str) -> None:
    """Until the process's command line holds `text`: right after Popen returns it can still read empty
    (measured here: 81 of 200 times), and the leak count would miss a stray that is really there."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if text.encode() in f.read():
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid}'s command line never named {text}")


def test_the_benchmark_given_root_does_not_count_itself(sandbox_root):
    # The benchmark's own command line (and its parent's) holds `--root DIR`, as the real run's does.
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import sandbox_lifecycle as s; "
            "B = type('B', (), {'root': sys.argv[3]}); print(json.dumps(s.count_leaks(B(), [])))")
    done = subprocess.run(["bash", "-c", f'"$@"; : {sandbox_root}', "runner",
                           sys.executable, "-c", code, str(BENCHMARKS), "--root", str(sandbox_root)],
                          capture_output=True, text=True, check=True)

    assert json.loads(done.stdout)["processes"] == 0


@dataclasses.dataclass
class _Backend:
    root: str
