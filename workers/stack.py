"""Starting Trove's moving parts inside one process: the embedded default, and the pieces tests need.

The embedded stack is: the recording proxy (a thread with its own event loop), the Celery worker thread on
the memory transport (only without REDIS_URL), a small beat thread that sends the periodic tasks Celery
beat would send, and optionally the offline demo model.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from django.conf import settings

from webapp.celery import app as celery_app

log = logging.getLogger("trove")
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


@dataclass
class EmbeddedStack:
    proxy_url: str
    demo_model_url: str | None
    stoppers: list = field(default_factory=list)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            try:
                stop()
            except Exception:  # noqa: BLE001 - best effort on shutdown, keep stopping the rest
                log.exception("stopping part of the embedded stack failed")


def start_proxy(*, host: str, port: int, unix_path: str | None = None, **app_options):
    """The recording proxy on a thread: on TCP, and also on the Unix socket `unix_path` (proxy-only local
    sandboxes reach it there) unless that is empty or too long for a socket path."""
    from webapp.proxy.server import serve_in_thread
    from webapp.proxy.wiring import make_trove_proxy_app

    app, sink = make_trove_proxy_app(**app_options)
    unix_path = prepare_proxy_socket(unix_path)
    server = serve_in_thread(app, host=host, port=port, unix_path=unix_path)
    if unix_path:
        os.chmod(unix_path, 0o666)  # sandboxes connect as their own unprivileged uid
    return server, sink


def prepare_proxy_socket(path: str | None) -> str | None:
    """The path to listen on (its directory made, searchable by sandboxes), or None: no path, or one too long
    for a Unix socket. The caller makes the socket itself 0666 once it exists (sandboxes run as another uid)."""
    if not path:
        return None
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        log.warning("proxy socket path %s is too long for a Unix socket; proxy-only sandboxes cannot reach "
                    "the proxy (set TROVE_PROXY_SOCKET to a shorter path)", path)
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o755)  # searchable by the sandbox uid; the directory is bound into sandboxes
    return path


def demo_model_v1(url: str) -> str:
    """The demo model's base URL in the OpenAI convention (with /v1), as an endpoint registers it."""
    return f"{url.rstrip('/').removesuffix('/v1')}/v1"


def start_demo_model(*, host: str = "127.0.0.1", port: int = 0):
    from workers.demo.model import serve_in_thread

    return serve_in_thread(host, port)


def start_embedded_stack(*, worker: bool | None = None, demo_model: bool = True, beat: bool = True,
                         proxy_port: int | None = None, concurrency: int = 2) -> EmbeddedStack:
    worker = (settings.REDIS_URL is None) if worker is None else worker
    server, sink = start_proxy(host=settings.TROVE_PROXY_HOST or "127.0.0.1",
                               port=settings.TROVE_PROXY_PORT if proxy_port is None else proxy_port,
                               unix_path=settings.TROVE_PROXY_SOCKET)
    settings.TROVE_PROXY_PUBLIC_URL = server.base_url  # the port may have been chosen by the OS
    stack = EmbeddedStack(proxy_url=server.base_url, demo_model_url=None)
    stack.stoppers += [server.stop, sink.close]
    if demo_model:
        url, stop_model = start_demo_model(port=settings.TROVE_DEMO_MODEL_PORT)
        stack.demo_model_url = url
        stack.stoppers.append(stop_model)
        from workers.seed import seed_demo_endpoint

        seed_demo_endpoint(demo_model_v1(url))  # jobs name it as `demo-model`
    if worker:
        from workers.embedded import start_embedded_worker, stop_embedded_worker

        start_embedded_worker(concurrency=concurrency)
        stack.stoppers.append(stop_embedded_worker)
    if beat:
        stack.stoppers.append(start_embedded_beat())
    # Stoppers run in reverse: the beat stops first, then this drains the sandboxes the stack made.
    stack.stoppers.insert(0, _terminate_local_sandboxes)
    return stack


def _terminate_local_sandboxes() -> None:
    from workers.fleet_ops import sandboxes_terminate_all

    sandboxes_terminate_all(backend_kind="local", reason="embedded stack stopped")


def start_embedded_beat():
    """Run each CELERY_BEAT_SCHEDULE task on its interval, in this thread.

    Not sent to the worker: its few threads are busy with rollouts for as long as a job runs, and a periodic
    task queued behind them would wait for the job to end (the reconciler could not keep the warm pool
    topped up, so every claim after the first few was cold). These tasks are short and idempotent.
    """
    stop = threading.Event()
    celery_app.loader.import_default_modules()  # registers the tasks this thread runs
    schedule = [(entry["task"], float(entry["schedule"])) for entry in settings.CELERY_BEAT_SCHEDULE.values()]

    def loop() -> None:
        import time

        next_run = {name: time.monotonic() + interval for name, interval in schedule}
        while not stop.wait(0.5):
            now = time.monotonic()
            for name, interval in schedule:
                if now >= next_run[name]:
                    _run_periodic(name)
                    next_run[name] = time.monotonic() + interval

    threading.Thread(target=loop, name="embedded-beat", daemon=True).start()
    return stop.set


def _run_periodic(name: str) -> None:
    from django.db import close_old_connections

    close_old_connections()
    result = celery_app.tasks[name].apply()
    if result.failed():
        log.error("periodic task %s failed: %r", name, result.result)
