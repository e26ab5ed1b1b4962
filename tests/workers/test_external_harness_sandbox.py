"""What an external harness relies on in a local sandbox: Trove's example harnesses at /opt/trove/harness, and
the recording proxy reached through the proxy-only forwarder — also after the proxy restarts."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from workers.sandboxes.base import SandboxSpec, SandboxStartFailed

ASK_PROXY = ("python3 -c \"import os, socket, urllib.parse; u = urllib.parse.urlparse(os.environ['TROVE_PROXY_URL']); "
             "s = socket.create_connection((u.hostname, u.port), timeout=5); s.sendall(b'ping'); "
             "s.shutdown(socket.SHUT_WR); print(s.recv(100).decode())\"")


class EchoSocket:
    """A Unix socket server answering each connection with `reply: <what it got>`, a stand-in for the proxy."""

    def __init__(self, path: str, reply: str) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        os.chmod(path, 0o666)
        self.server.listen(8)
        self.reply = reply.encode()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.reply + b": " + conn.recv(1024))

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def socket_dir():
    directory = tempfile.mkdtemp(prefix="trove-proxy-", dir="/tmp")
    os.chmod(directory, 0o755)
    yield Path(directory)
    for entry in Path(directory).iterdir():
        entry.unlink()
    os.rmdir(directory)


def sandbox(backend, **spec):
    name = f"ext-{uuid.uuid4().hex[:8]}"
    return backend.create(SandboxSpec(name=name, **spec))


def test_the_example_harnesses_are_in_every_local_sandbox_read_only(local_backend):
    handle = sandbox(local_backend)

    listed = local_backend.exec(handle, "ls /opt/trove/harness && touch /opt/trove/harness/x")

    assert "mini_agent.py" in listed.stdout.split()
    assert listed.exit_code != 0 and "Read-only" in listed.stderr


def test_a_sandbox_still_reaches_the_proxy_after_the_proxy_restarted(local_backend, socket_dir):
    path = str(socket_dir / "proxy.sock")
    first = EchoSocket(path, "first proxy")
    handle = sandbox(local_backend, network="proxy-only", proxy_socket=path)
    before = local_backend.exec(handle, ASK_PROXY, timeout=30)

    first.close()
    os.unlink(path)
    second = EchoSocket(path, "second proxy")  # a new socket file: a file bind would still see the old one
    try:
        after = local_backend.exec(handle, ASK_PROXY, timeout=30)
    finally:
        second.close()

    assert before.stdout == "first proxy: ping\n", before.stderr
    assert after.stdout == "second proxy: ping\n", after.stderr


def test_a_proxy_socket_beside_other_files_is_refused_so_nothing_else_is_exposed(local_backend, socket_dir):
    path = str(socket_dir / "proxy.sock")
    server = EchoSocket(path, "proxy")
    (socket_dir / "secrets.txt").write_text("not for sandboxes\n")
    try:
        with pytest.raises(SandboxStartFailed) as refused:
            sandbox(local_backend, network="proxy-only", proxy_socket=path)
    finally:
        server.close()

    assert refused.value.permanent and refused.value.reason == "proxy_socket_dir"
    assert local_backend.list({}) == []
