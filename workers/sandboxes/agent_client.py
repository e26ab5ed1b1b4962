"""Client side of the in-sandbox agent wire protocol (see `workers/sandboxes/base.py`).

One request per connection, one JSON line each way, to `unix:/path/agent.sock` or `tcp:HOST:PORT`.
Shared by the backends: they differ in how a sandbox is made, not in how its agent is spoken to.
Errors say whether a retry can help: a refused or dropped connection is `AgentUnavailable` (transient),
a wrong secret is `AgentAuthError`, a bad path or request is a permanent `SandboxError`.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from typing import Any

from workers.sandboxes.base import AgentAuthError, AgentUnavailable, ExecResult, SandboxError

# How long past the command's own timeout we wait for the agent's answer: the agent needs a moment to
# kill the process group and send what was captured.
REPLY_MARGIN = 15.0
MAX_REPLY_BYTES = 64 * 1024 * 1024


class AgentClient:
    def __init__(self, endpoint: str, secret: str, *, connect_timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.secret = secret
        self.connect_timeout = connect_timeout

    def ping(self, *, timeout: float = 5.0) -> int:
        return int(self.call("ping", {}, wait=timeout).get("pid", 0))

    def exec(
        self,
        cmd: str,
        *,
        timeout: float = 60.0,
        idle_timeout: float | None = None,
        max_output: int = 64 * 1024,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        fields = {"cmd": cmd, "timeout": timeout, "idle_timeout": idle_timeout, "max_output": max_output,
                  "cwd": cwd, "env": env}
        # The agent enforces `timeout`; waiting a margin longer only guards against a hung agent.
        reply = self.call("exec", fields, wait=timeout + REPLY_MARGIN)
        return ExecResult(
            exit_code=reply.get("exit_code"),
            stdout=reply.get("stdout", ""),
            stderr=reply.get("stderr", ""),
            duration_ms=float(reply.get("duration_ms", 0.0)),
            timed_out=bool(reply.get("timed_out", False)),
            idle_timed_out=bool(reply.get("idle_timed_out", False)),
            truncated_bytes=int(reply.get("truncated_bytes", 0)),
        )

    def read_file(self, path: str, *, timeout: float = 30.0) -> bytes:
        return base64.b64decode(self.call("read_file", {"path": path}, wait=timeout)["content_b64"])

    def write_file(self, path: str, content: bytes, *, timeout: float = 30.0) -> None:
        self.call("write_file", {"path": path, "content_b64": base64.b64encode(content).decode()}, wait=timeout)

    def call(self, op: str, fields: dict[str, Any], *, wait: float) -> dict[str, Any]:
        """Send one request and return the agent's reply (`ok` true), or raise a typed error.
        `wait` bounds each socket operation of the exchange."""
        request = {"op": op, "secret": self.secret, **fields}
        started = time.monotonic()
        try:
            with self._connect() as sock:
                sock.settimeout(max(wait, 0.1))
                sock.sendall(json.dumps(request).encode() + b"\n")
                line = _read_line(sock)
        except (ConnectionError, TimeoutError, OSError) as exc:
            elapsed = time.monotonic() - started
            raise AgentUnavailable(
                f"agent at {self.endpoint} did not answer {op} ({exc.__class__.__name__}: {exc}; {elapsed:.1f}s)",
                reason="agent_unavailable",
            ) from exc
        return _check(op, line)

    def _connect(self) -> socket.socket:
        kind, _, address = self.endpoint.partition(":")
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            try:
                sock.connect(address)
            except BaseException:
                sock.close()
                raise
            return sock
        if kind == "tcp":
            host, _, port = address.rpartition(":")
            return socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout)
        raise SandboxError(f"unsupported agent endpoint {self.endpoint!r}", reason="bad_endpoint", permanent=True)


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("agent closed the connection before replying")
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunks.append(chunk[:newline])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise ConnectionError(f"agent reply longer than {MAX_REPLY_BYTES} bytes")


def _check(op: str, line: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(line)
    except ValueError as exc:
        raise AgentUnavailable(f"agent sent a malformed {op} reply", reason="agent_protocol") from exc
    if not isinstance(reply, dict):
        raise AgentUnavailable(f"agent sent a malformed {op} reply", reason="agent_protocol")
    if reply.get("ok"):
        return reply
    code, message = str(reply.get("error", "internal")), str(reply.get("message", ""))
    if code == "auth":
        raise AgentAuthError(f"agent refused the secret: {message}", reason="agent_auth")
    # A bad path or request will fail the same way again; an internal error might not.
    raise SandboxError(f"agent {op} failed ({code}): {message}", reason=f"agent_{code}",
                       permanent=code in ("path", "bad_request"))
