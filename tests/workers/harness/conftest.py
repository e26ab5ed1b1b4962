"""A real executor for harness tests: `bash -c` in a directory holding a copy of a demo task.

The real sandbox backends live in workers/sandboxes; this runs the same commands as plain subprocesses
with the host's /usr on PATH (what a local sandbox sees), a timeout that kills the process group, and an
output cap that counts what it cut, as the ExecResult contract says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workers.demo.tasks import DemoTask, write_files
from workers.sandboxes.base import ExecResult

SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class SubprocessExecutor:
    def __init__(self, root: Path, *, timeout: float = 60.0, max_output: int = 64 * 1024) -> None:
        self.root = root
        self.timeout = timeout
        self.max_output = max_output

    def __call__(self, cmd: str) -> ExecResult:
        started = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=self.root,
            env=SANDBOX_ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        cut = max(0, len(out) - self.max_output) + max(0, len(err) - self.max_output)
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=out[: self.max_output].decode("utf-8", "replace"),
            stderr=err[: self.max_output].decode("utf-8", "replace"),
            duration_ms=(time.monotonic() - started) * 1000,
            timed_out=timed_out,
            truncated_bytes=cut,
        )


@pytest.fixture
def task_workspace(tmp_path) -> Callable[[DemoTask], SubprocessExecutor]:
    """Make a fresh copy of a demo task's files and return an executor working in it."""
    counter = iter(range(10**6))

    def make(task: DemoTask) -> SubprocessExecutor:
        root = tmp_path / f"{task.key}-{next(counter)}"
        root.mkdir()
        write_files(root, task.files)
        return SubprocessExecutor(root)

    return make
