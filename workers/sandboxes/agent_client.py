"""Client side of the in-sandbox agent wire protocol (see `workers/sandboxes/base.py`).

One request per connection, one JSON line each way, to `unix:/path/agent.sock` or `tcp:HOST:PORT`.
Shared by the backends: they differ in how a sandbox is made, not in how its agent is spoken to.
Every exchange is authenticated both ways (see "authentication" in agent.py): the secret never crosses the
wire, and a reply is believed only if it is signed over this connection's nonce and this request.
Errors say whether a retry can help: a refused or dropped connection is `AgentUnavailable` (transient),
a wrong secret is `AgentAuthError`, a reply that fails its signature (an impostor answering, or tampering)
is `AgentIntegrityError`, a bad path or request is a permanent `SandboxError`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from workers.sandboxes.agent import GREETING, MAC_HEX_LENGTH, REQUEST_CONTEXT, RESPONSE_CONTEXT, split_signed
from workers.sandboxes.base import (
    AgentAuthError,
    AgentIntegrityError,
    AgentUnavailable,
    ExecResult,
    SandboxError,
)

# How long past the command's own timeout we wait for the agent's answer: the agent needs a moment to
# kill the process group and send what was captured.
REPLY_MARGIN = 15.0
MAX_REPLY_BYTES = 64 * 1024 * 1024
MAX_GREETING_BYTES = 256
WRITE_BATCH_BYTES = 8 * 1024 * 1024  # of file content per write_files exchange (base64 makes it 4/3 on the wire)


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
        before_send: Callable[[], None] | None = None,
    ) -> ExecResult:
        fields = {"cmd": cmd, "timeout": timeout, "idle_timeout": idle_timeout, "max_output": max_output,
                  "cwd": cwd, "env": env}
        # The agent enforces `timeout`; waiting a margin longer only guards against a hung agent.
        reply = self.call("exec", fields, wait=timeout + REPLY_MARGIN, before_send=before_send)
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

    def write_file(self, path: str, content: bytes, *, timeout: float = 30.0,
                   before_send: Callable[[], None] | None = None) -> None:
        self.call("write_file", {"path": path, "content_b64": base64.b64encode(content).decode()}, wait=timeout,
                  before_send=before_send)

    def write_files(self, files: dict[str, bytes], *, timeout: float = 30.0,
                    before_send: Callable[[], None] | None = None) -> None:
        """Write several files in as few exchanges as WRITE_BATCH_BYTES allows (one, usually), in order. An
        agent from before the `write_files` op (a sandbox started by an older Trove) gets one write_file each."""
        for batch in _batches(files):
            entries = [{"path": path, "content_b64": base64.b64encode(content).decode()} for path, content in batch]
            try:
                self.call("write_files", {"files": entries}, wait=timeout, before_send=before_send)
            except SandboxError as error:
                if not _unknown_op(error):
                    raise
                for path, content in batch:
                    self.write_file(path, content, timeout=timeout)
            before_send = None  # it ran before the first exchange's request was sent

    def call(self, op: str, fields: dict[str, Any], *, wait: float,
             before_send: Callable[[], None] | None = None) -> dict[str, Any]:
        """Send one signed request and return the agent's verified reply (`ok` true), or raise a typed error.
        `wait` bounds each socket operation of the exchange after the greeting. `before_send` (a caller's
        check, e.g. the lease's fence) runs once the connection is open and before anything is sent: the
        agent's greeting travels while it runs, and if it raises nothing is sent (the agent drops a
        connection that says nothing)."""
        body = json.dumps({"op": op, "nonce": secrets.token_hex(16), **fields}).encode()
        started = time.monotonic()
        try:
            with self._connect() as sock:
                if before_send is not None:
                    before_send()
                reader = _LineReader(sock)
                sock.settimeout(max(self.connect_timeout, 0.1))
                nonce = self._greeting_nonce(reader.line(MAX_GREETING_BYTES))
                request_mac = self._sign(REQUEST_CONTEXT, nonce, b"\n", body)
                sock.settimeout(max(wait, 0.1))
                sock.sendall(request_mac + b" " + body + b"\n")
                line = reader.line(MAX_REPLY_BYTES)
        except (ConnectionError, TimeoutError, OSError) as exc:
            elapsed = time.monotonic() - started
            raise AgentUnavailable(
                f"agent at {self.endpoint} did not answer {op} ({exc.__class__.__name__}: {exc}; {elapsed:.1f}s)",
                reason="agent_unavailable",
            ) from exc
        return _check(op, self._verified(op, nonce, request_mac, line))

    def _sign(self, *parts: bytes) -> bytes:
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.hexdigest().encode()

    def _greeting_nonce(self, line: bytes) -> bytes:
        nonce = line.removeprefix(GREETING)
        if not line.startswith(GREETING) or len(nonce) != 32 or nonce.strip(b"0123456789abcdef"):
            raise AgentIntegrityError(f"{self.endpoint} did not greet as a Trove agent: {line[:80]!r}",
                                      reason="agent_protocol")
        return nonce

    def _verified(self, op: str, nonce: bytes, request_mac: bytes, line: bytes) -> bytes:
        """The reply's JSON once its signature checks out. Anything else means that whatever answered does not
        hold this sandbox's secret (an impostor, or a tampered reply): never believed, never retried."""
        reply_mac, body = split_signed(line)
        expected = self._sign(RESPONSE_CONTEXT, nonce, b"\n", request_mac, b"\n", body)
        if len(reply_mac) != MAC_HEX_LENGTH or not hmac.compare_digest(reply_mac, expected):
            raise AgentIntegrityError(
                f"the {op} reply from {self.endpoint} is not signed by this sandbox's agent: the agent was replaced "
                "or impersonated, or the reply was tampered with", reason="agent_forged")
        return body

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


def _batches(files: dict[str, bytes]) -> list[list[tuple[str, bytes]]]:
    """Files in order, grouped so that a batch's content stays under WRITE_BATCH_BYTES (a larger file goes
    alone): far under the agent's request limit, whatever the files."""
    batches: list[list[tuple[str, bytes]]] = []
    size = 0
    for path, content in files.items():
        if not batches or size + len(content) > WRITE_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append((path, content))
        size += len(content)
    return batches


def _unknown_op(error: SandboxError) -> bool:
    return error.reason == "agent_bad_request" and "unknown op" in str(error)


class _LineReader:
    """Lines from a socket, keeping what arrived past a newline for the next line."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rest = b""

    def line(self, limit: int) -> bytes:
        """The next line without its newline; ConnectionError at end of stream or past `limit` bytes."""
        chunks, size, chunk = [], 0, self.rest
        while (newline := chunk.find(b"\n")) < 0:
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ConnectionError(f"agent line longer than {limit} bytes")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("agent closed the connection before replying")
        chunks.append(chunk[:newline])
        self.rest = chunk[newline + 1:]
        return b"".join(chunks)


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
