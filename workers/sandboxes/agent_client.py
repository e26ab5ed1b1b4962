"""Host side of the agent wire protocol (see base.py): one request per connection, JSON lines.

Shared by every backend: the local one reaches the agent at `unix:/path/agent.sock`, the Kubernetes one at
`tcp:POD_IP:PORT`. `AgentClient(endpoint, secret)` is all a backend needs to implement exec and file access.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any

from workers.sandboxes.base import AgentAuthError, AgentUnavailable, ExecResult, SandboxError

UNIX_PATH_MAX = 107  # sun_path holds 108 bytes including the terminating NUL
RESPONSE_GRACE = 10.0  # how much longer than the command's own timeout to wait for the agent's answer
# Error codes that no retry can fix: the request itself is wrong.
PERMANENT_CODES = {"bad_request", "path"}


class AgentClient:
    """Talks to one sandbox's agent. Stateless apart from the address and secret; thread-safe."""

    def __init__(self, endpoint: str, secret: str) -> None:
        self.endpoint = endpoint
        self.secret = secret

    def ping(self, *, timeout: float = 5.0) -> int:
        """The agent's pid. Raises AgentUnavailable if it does not answer."""
        return int(self.call({"op": "ping"}, timeout=timeout)["pid"])

    def exec(self, cmd: str, *, timeout: float = 60.0, idle_timeout: float | None = None,
             max_output: int = 64 * 1024, cwd: str | None = None,
             env: dict[str, str] | None = None) -> ExecResult:
        request = {"op": "exec", "cmd": cmd, "timeout": timeout, "idle_timeout": idle_timeout,
                   "max_output": max_output, "cwd": cwd, "env": env}
        response = self.call(request, timeout=timeout + RESPONSE_GRACE)
        return ExecResult(
            exit_code=response["exit_code"], stdout=response["stdout"], stderr=response["stderr"],
            duration_ms=response["duration_ms"], timed_out=response["timed_out"],
            idle_timed_out=response["idle_timed_out"], truncated_bytes=response["truncated_bytes"],
        )

    def read_file(self, path: str, *, timeout: float = 60.0) -> bytes:
        response = self.call({"op": "read_file", "path": path}, timeout=timeout)
        return base64.b64decode(response["content_b64"])

    def write_file(self, path: str, content: bytes, *, timeout: float = 60.0) -> None:
        content_b64 = base64.b64encode(content).decode()
        self.call({"op": "write_file", "path": path, "content_b64": content_b64}, timeout=timeout)

    def call(self, request: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Send one request and return the successful response. Raises AgentUnavailable (no connection or
        no answer: transient), AgentAuthError, or SandboxError with `reason` = the agent's error code."""
        line = json.dumps({**request, "secret": self.secret}).encode() + b"\n"
        try:
            with connect(self.endpoint, timeout=timeout) as sock:
                sock.sendall(line)
                raw = sock.makefile("rb").readline()
        except OSError as exc:
            raise AgentUnavailable(f"agent at {self.endpoint}: {exc}", reason="unreachable") from exc
        if not raw:
            raise AgentUnavailable(f"agent at {self.endpoint} closed the connection without answering",
                                   reason="no_answer")
        return _checked(json.loads(raw))


def connect(endpoint: str, *, timeout: float) -> socket.socket:
    """A connected socket to `unix:/path` or `tcp:host:port`, with `timeout` on every operation."""
    kind, _, address = endpoint.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            _connect_unix(sock, address)
        except BaseException:
            sock.close()
            raise
        return sock
    if kind == "tcp":
        host, _, port = address.rpartition(":")
        return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    raise ValueError(f"bad agent endpoint {endpoint!r}")


def _connect_unix(sock: socket.socket, path: str) -> None:
    """Connect, working around the 107-byte limit on socket paths: a longer path is reached through an
    O_PATH descriptor of its directory (/proc/self/fd/N/name)."""
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        sock.connect(path)
        return
    dir_fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}")
    finally:
        os.close(dir_fd)


def _checked(response: dict[str, Any]) -> dict[str, Any]:
    if response.get("ok"):
        return response
    code = str(response.get("error", "internal"))
    message = str(response.get("message", ""))
    if code == "auth":
        raise AgentAuthError(f"agent refused the secret: {message}", reason="auth")
    raise SandboxError(f"agent error {code}: {message}", reason=code, permanent=code in PERMANENT_CODES)
