"""The one interface every sandbox backend implements (local bubblewrap, Kubernetes).

A backend knows nothing of the database: the fleet services in `webapp.fleets` keep the rows and call a
backend through this interface. Every method may be retried: `create` with the same name must not make
two sandboxes (names are deterministic), `destroy` of a sandbox that is already gone succeeds.

Exec and file access go to a small agent inside the sandbox (`workers/sandboxes/agent.py`, stdlib only).
Agent wire protocol, the same over a Unix socket (local) and TCP at the pod IP (Kubernetes): one exchange
per connection, each side's JSON line signed with HMAC-SHA256 under the per-sandbox secret (which never
crosses the wire): the agent greets with a nonce, the host sends `<mac> <request>`, the agent answers
`<mac> <response>` (see "authentication" in agent.py).
    request:  {"op": "exec"|"read_file"|"write_file"|"ping", "nonce": "<host's own nonce>", ...}
    exec:     {"cmd": str, "timeout": float, "idle_timeout": float|null, "max_output": int, "cwd": str|null,
               "env": {str: str}|null}
              -> {"ok": true, "exit_code": int|null, "stdout": str, "stderr": str, "duration_ms": float,
                  "timed_out": bool, "idle_timed_out": bool, "truncated_bytes": int}
    read_file:  {"path": str (relative to the workspace)} -> {"ok": true, "content_b64": str}
    write_file: {"path": str, "content_b64": str} -> {"ok": true}
    ping:       {} -> {"ok": true, "pid": int}
    any error:  {"ok": false, "error": "<code>", "message": str}   codes: auth, bad_request, path, internal
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class SandboxError(Exception):
    """Base for backend errors. `permanent` tells a caller whether retrying can help."""

    permanent = False

    def __init__(self, message: str, *, reason: str = "", permanent: bool | None = None) -> None:
        super().__init__(message)
        self.reason = reason or self.__class__.__name__
        if permanent is not None:
            self.permanent = permanent


class SandboxNotFound(SandboxError):
    permanent = True


class SandboxStartFailed(SandboxError):
    """The sandbox never came up (bad image, agent did not answer, unschedulable)."""


class AgentAuthError(SandboxError):
    permanent = True


class AgentIntegrityError(AgentAuthError):
    """What answered is not the sandbox's agent, or its reply was changed: the reply is not signed with the
    sandbox's secret. Nothing from that sandbox can be trusted any more (a policy may have replaced its agent)."""


class AgentUnavailable(SandboxError):
    """The agent did not answer (sandbox died, network). Transient from the caller's view."""


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox should be, derived from an EnvironmentTemplate.

    `files` are written into the workspace before the sandbox is handed out; `setup_commands` run once.
    Limits of None mean "the backend's default".
    """

    name: str  # deterministic, unique per backend: a retried create with the same name is a no-op
    labels: dict[str, str] = field(default_factory=dict)
    image: str = ""  # Kubernetes: image reference (pinned by digest); local: ignored
    rootfs: str = ""  # local: a root filesystem to use instead of the host's read-only /usr
    cpu: float | None = None  # cores
    memory_mb: int | None = None
    pids: int | None = None
    disk_mb: int | None = None
    network: str = "none"  # none | proxy-only | allow-list
    proxy_socket: str = ""  # local proxy-only: host path of the proxy's Unix socket
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SandboxHandle:
    """What a backend returns about one sandbox. `endpoint` + `secret` are enough to reach its agent."""

    name: str
    state: str  # provisioning | ready | failed | terminating | gone
    endpoint: str = ""  # local: unix:/path/to/agent.sock ; kubernetes: tcp:10.0.0.5:7070
    secret: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool = False
    idle_timed_out: bool = False
    truncated_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxBackend(abc.ABC):
    """create/get/list/exec/read_file/write_file/destroy. All calls are synchronous and thread-safe."""

    name: str = "base"

    @abc.abstractmethod
    def create(self, spec: SandboxSpec, *, wait: bool = True, timeout: float = 60.0) -> SandboxHandle:
        """Create (or find, if it already exists) the sandbox `spec.name`. With `wait`, return once its
        agent answers, or raise SandboxStartFailed and leave nothing behind."""

    @abc.abstractmethod
    def get(self, name: str) -> SandboxHandle:
        """Raise SandboxNotFound if the backend has no such sandbox."""

    @abc.abstractmethod
    def list(self, labels: dict[str, str]) -> list[SandboxHandle]:
        """Every sandbox the backend has whose labels include `labels`."""

    @abc.abstractmethod
    def exec(
        self,
        handle: SandboxHandle,
        cmd: str,
        *,
        timeout: float = 60.0,
        idle_timeout: float | None = None,
        max_output: int = 64 * 1024,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> ExecResult:
        """Run `cmd` with bash in the workspace. A timeout kills the command's process group, not the
        sandbox. Output beyond `max_output` bytes per stream is cut and counted in `truncated_bytes`.
        `before_send` runs once the agent's connection is open, before the request is sent; if it raises,
        nothing reaches the sandbox (the lease's fence check overlaps the connection's set-up this way)."""

    @abc.abstractmethod
    def read_file(self, handle: SandboxHandle, path: str) -> bytes: ...

    @abc.abstractmethod
    def write_file(self, handle: SandboxHandle, path: str, content: bytes, *,
                   before_send: Callable[[], None] | None = None) -> None:
        """Write `content` to `path` in the workspace; `before_send` as for exec."""

    def write_files(self, handle: SandboxHandle, files: dict[str, bytes], *,
                    before_send: Callable[[], None] | None = None) -> None:
        """write_file for each, in order; backends whose agent takes several files in one exchange override
        this. `before_send` runs before the first file is sent."""
        for path, content in files.items():
            self.write_file(handle, path, content, before_send=before_send)
            before_send = None

    @abc.abstractmethod
    def destroy(self, name: str) -> None:
        """Remove the sandbox and everything it made (processes, directories, mounts, cgroups).
        Idempotent: destroying a sandbox that is already gone is not an error."""
