"""Serving the proxy from a background thread, on TCP and on a Unix socket."""

from __future__ import annotations

import socket

import pytest

from tests.webapp.proxy.harness import UpstreamState, send
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread


def test_it_serves_on_a_unix_socket_and_tcp_at_once(tmp_path, upstream: UpstreamState):
    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)

    async def resolve(token: str) -> Target | None:
        return Target("r", "t", f"{upstream.url}/v1") if token == "tok" else None

    path = str(tmp_path / "proxy.sock")
    server = serve_in_thread(make_proxy_app(resolve=resolve, sink=sink), port=0, unix_path=path)
    body = {"model": "scripted-ok", "messages": [{"role": "user", "content": "hi"}]}
    try:
        over_unix = send("http://proxy/r/tok/v1/chat/completions", body=body, unix_path=path)
        over_tcp = send(f"{server.base_url}/r/tok/v1/chat/completions", body=body)
    finally:
        server.stop()
        sink.close()

    assert over_unix.status == over_tcp.status == 200
    assert over_unix.json()["choices"][0]["message"]["content"] == "ls -la"
    assert len(records) == 2


def test_a_port_in_use_is_reported_by_serve_in_thread():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sink = InProcessSink(lambda batch: None)

        async def resolve(token: str) -> Target | None:
            return None

        with pytest.raises(OSError):
            serve_in_thread(make_proxy_app(resolve=resolve, sink=sink), port=port)
        sink.close()

