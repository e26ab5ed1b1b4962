"""The executor of the harness tests: a real bubblewrap sandbox (the local backend) holding a demo task.

Model-chosen commands run where a rollout's would, never on the test host: the workspace, the read-only
system, the dropped privileges and the exec contract (timeouts, output caps) are the local backend's own.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable

import pytest

from workers.demo.tasks import DemoTask
from workers.sandboxes.base import ExecResult, SandboxHandle, SandboxSpec
from workers.sandboxes.local import LocalBackend


class SandboxExecutor:
    """`execute(cmd)` for a harness: runs the command in one sandbox's workspace."""

    def __init__(self, backend: LocalBackend, handle: SandboxHandle, *, timeout: float = 60.0) -> None:
        self.backend = backend
        self.handle = handle
        self.timeout = timeout

    def __call__(self, cmd: str) -> ExecResult:
        return self.backend.exec(self.handle, cmd, timeout=self.timeout)

    def exists(self, path: str) -> bool:
        """Whether `path` (relative to the workspace) exists inside the sandbox."""
        return self.backend.exec(self.handle, f"test -e {shlex.quote(path)}").exit_code == 0


@pytest.fixture
def task_workspace(local_backend) -> Callable[[DemoTask], SandboxExecutor]:
    """A fresh sandbox with a copy of a demo task's files, and an executor working in it (destroyed after)."""

    def make(task: DemoTask) -> SandboxExecutor:
        handle = local_backend.create(SandboxSpec(name=f"harness-{uuid.uuid4().hex[:10]}"))
        for path, text in task.files.items():
            local_backend.write_file(handle, path, text.encode())
        return SandboxExecutor(local_backend, handle)

    return make
