"""Serving the proxy from a background thread, on TCP and on a Unix socket; and as several processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.webapp.proxy.harness import UpstreamState, closed_port, send
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.records import CallRecord
from webapp.proxy.server import serve_in_thread


def test_it_serves_on_a_unix_socket_and_tcp_at_once(tmp_path, upstream: UpstreamState):
    records: list[CallRecord] = []
    sink = InProcessSink(records.extend)

    async def resolve(token: str) -> Target | None:
        return Target("r", "t", f"{upstream.url}/v1", allow_private_network=True) if token == "tok" else None

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



WORKERS_SCRIPT = """
import os, sys
from aiohttp import web
from webapp.proxy.app import Target, make_proxy_app
from webapp.proxy.recorder import InProcessSink
from webapp.proxy.server import serve_proxy

upstream, port, out, unix_path = sys.argv[1:5]


def make_app():
    path = os.path.join(out, f"{os.getpid()}.calls")

    def write(batch):
        with open(path, "a") as recorded:
            recorded.writelines(record.call_id + "\\n" for record in batch)

    target = Target("r", "t", upstream + "/v1", allow_private_network=True)

    async def resolve(token):
        return target

    async def pid(request):
        return web.Response(text=str(os.getpid()))

    sink = InProcessSink(write, linger_s=0.5)  # records still buffered when the stop comes
    app = make_proxy_app(resolve=resolve, sink=sink)
    app.router.add_get("/pid", pid)
    return app, sink


serve_proxy(make_app, workers=2, host="127.0.0.1", port=int(port), unix_path=unix_path)
"""


def _children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _answers(url: str, **options) -> bool:
    try:
        return send(url, method="GET", **options).status == 200
    except OSError:
        return False


def test_several_workers_share_the_port_one_that_dies_is_replaced_and_a_stop_records_every_call(
    tmp_path, upstream: UpstreamState
):
    port, unix_path = closed_port(), str(tmp_path / "proxy.sock")
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    supervisor = subprocess.Popen([sys.executable, "-c", WORKERS_SCRIPT, upstream.url, str(port), str(tmp_path),
                                   unix_path], env=env, cwd=repo)
    base = f"http://127.0.0.1:{port}"
    body = {"model": "scripted-ok", "messages": [{"role": "user", "content": "hi"}]}
    try:
        _wait_for(lambda: len(_children(supervisor.pid)) == 2 and _answers(f"{base}/healthz"), "two workers")
        serving = {send(f"{base}/pid", method="GET").body for _ in range(30)}  # a new connection each
        made = [f"w{i}" for i in range(40)]
        statuses = [send(f"{base}/r/tok/v1/chat/completions", body=body, call_id=c).status for c in made[:30]]
        killed = sorted(_children(supervisor.pid))[0]
        os.kill(killed, signal.SIGKILL)  # its buffered records die with it: a crash, not a stop
        _wait_for(lambda: killed not in _children(supervisor.pid) and len(_children(supervisor.pid)) == 2,
                  "a replacement worker")
        _wait_for(lambda: _answers(f"{base}/healthz"), "the workers to answer")
        statuses += [send("http://proxy/r/tok/v1/chat/completions", body=body, call_id=c, unix_path=unix_path).status
                     for c in made[30:]]
        supervisor.send_signal(signal.SIGTERM)
        exit_code = supervisor.wait(30)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()

    recorded = {path.stem: path.read_text().split() for path in tmp_path.glob("*.calls")}
    survivors = [calls for pid, calls in recorded.items() if int(pid) != killed]
    assert statuses == [200] * 40 and exit_code == 0
    assert len(serving) == 2, "the kernel spreads connections over both workers"
    assert set(made[30:]) <= {c for calls in survivors for c in calls}, "a stopped worker flushes its sink"
    assert all(len(calls) == len(set(calls)) for calls in recorded.values())
