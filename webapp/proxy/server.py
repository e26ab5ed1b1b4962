"""Running the proxy app: in the foreground (its own process, or several: `serve_proxy`) or in a
background thread with its own event loop (the embedded default, inside the web process). Either way it
can listen on TCP, on a Unix socket, or both. uvloop is used when it is installed, and not required.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL_S = 0.0005
MAX_DEFAULT_WORKERS = 8
RESPAWN_DELAY_S = 1.0
SUPERVISE_POLL_S = 0.1  # how often the supervisor looks for a worker that exited


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_proxy(
    *,
    app: web.Application,
    host: str = "127.0.0.1",
    port: int | None = 8090,
    unix_path: str | None = None,
    unix_socket: socket.socket | None = None,
    reuse_port: bool = False,
    shutdown_timeout: float = 30.0,
    access_log: bool = False,
    gil_switch_interval_s: float | None = GIL_SWITCH_INTERVAL_S,
) -> None:
    """Serve `app` in the foreground, in this process, until SIGINT / SIGTERM. `port=None` with a
    `unix_path` (or an already bound `unix_socket`) listens on the socket only. Access logging is off by
    default: a log line per call costs more than the rest of the proxy's own work on it.

    The process is the proxy's, so its GIL switch interval is tuned for the event loop (None: leave it):
    while the record writer's thread runs Python (the database writer is CPU work), a loop thread that
    wants the GIL back waits up to the interval, 5 ms by default, and every call in flight waits with
    it. At 0.5 ms the proxy's added median and tail latency fall by half or more, for a little more
    switching."""
    if gil_switch_interval_s is not None:
        sys.setswitchinterval(gil_switch_interval_s)
    web.run_app(
        app,
        host=host if port is not None else None,
        port=port,
        path=unix_path,
        sock=unix_socket,
        reuse_port=reuse_port or None,
        shutdown_timeout=shutdown_timeout,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        print=None,
        loop=new_event_loop(),
    )


AppFactory = Callable[[], tuple[web.Application, Any]]  # -> (app, its record sink: anything with close())


def default_workers() -> int:
    """The proxy's default process count: one per CPU this process may run on, at most
    MAX_DEFAULT_WORKERS. The proxy is CPU-bound Python (one core per process at most); more processes than
    cores only add context switches, and each holds a database connection for its token checks."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


def serve_proxy(
    make_app: AppFactory,
    *,
    workers: int = 1,
    host: str = "127.0.0.1",
    port: int | None = 8090,
    unix_path: str | None = None,
    shutdown_timeout: float = 30.0,
    sink_close_timeout: float = 30.0,
) -> None:
    """Serve the proxy in the foreground until SIGINT / SIGTERM, in `workers` processes.

    `make_app()` returns (app, sink); each process makes its own (its own event loop, upstream pool,
    token connection, record sink and spool segment) and closes the sink after its app has stopped, so
    every call it answered is handed on before it exits. With several workers this process supervises:
    each worker listens on the TCP port with SO_REUSEPORT (the kernel spreads connections over them) and
    on the Unix socket this process bound; a worker that dies is started again after RESPAWN_DELAY_S;
    SIGINT / SIGTERM is passed on to every worker and waited for. The caller must hold no threads or
    database connections across the fork (make them in `make_app`).
    """
    if workers <= 1:
        _serve_here(make_app, host=host, port=port, unix_path=unix_path, shutdown_timeout=shutdown_timeout,
                    sink_close_timeout=sink_close_timeout)
        return
    if port == 0:
        raise ValueError("several workers share a fixed port: pass one (not 0)")
    unix_socket = _bound_unix_socket(unix_path) if unix_path is not None else None
    _Supervisor(
        lambda: _serve_here(make_app, host=host, port=port, unix_socket=unix_socket, reuse_port=True,
                            shutdown_timeout=shutdown_timeout, sink_close_timeout=sink_close_timeout),
        workers=workers,
        stop_timeout=shutdown_timeout + sink_close_timeout + 5.0,
    ).run()


def _serve_here(
    make_app: AppFactory,
    *,
    host: str,
    port: int | None,
    unix_path: str | None = None,
    unix_socket: socket.socket | None = None,
    reuse_port: bool = False,
    shutdown_timeout: float,
    sink_close_timeout: float,
) -> None:
    app, sink = make_app()
    try:
        run_proxy(app=app, host=host, port=port, unix_path=unix_path, unix_socket=unix_socket,
                  reuse_port=reuse_port, shutdown_timeout=shutdown_timeout)
    finally:
        sink.close(sink_close_timeout)


def _bound_unix_socket(path: str) -> socket.socket:
    # Bound once, here: a Unix socket cannot be shared with SO_REUSEPORT; the workers accept on this one.
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class _Supervisor:
    """Forks `workers` children running `serve`, starts again one that dies, and stops them all on
    SIGINT / SIGTERM."""

    def __init__(self, serve: Callable[[], None], *, workers: int, stop_timeout: float) -> None:
        self._serve = serve
        self._workers = workers
        self._stop_timeout = stop_timeout
        self._children: set[int] = set()
        self._stopping = False

    def run(self) -> None:
        previous = {sig: signal.signal(sig, self._on_stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for _ in range(self._workers):
                self._spawn()
            while self._children and not self._stopping:
                # Polled, not a blocking os.wait(): that resumes after a signal (PEP 475), and a stop signal
                # must lead to _stop_all's timed wait even when no worker ever exits on its own.
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    time.sleep(SUPERVISE_POLL_S)
                    continue
                self._children.discard(pid)
                if not self._stopping:
                    log.error("proxy worker %d exited (status %d); starting another", pid, status)
                    time.sleep(RESPAWN_DELAY_S)
                    if not self._stopping:
                        self._spawn()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _spawn(self) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: aiohttp's run_app installs its own SIGINT / SIGTERM handling
            code = 1
            try:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                self._serve()
                code = 0
            except BaseException:
                log.exception("proxy worker failed")
            finally:
                logging.shutdown()
                os._exit(code)
        self._children.add(pid)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True  # run() leaves its loop; _stop_all passes the signal on and bounds the wait

    def _stop_all(self) -> None:
        self._stopping = True
        deadline = time.monotonic() + self._stop_timeout
        for pid in list(self._children):
            _signal_quietly(pid, signal.SIGTERM)
        while self._children and time.monotonic() < deadline:
            for pid in list(self._children):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self._children.discard(pid)
            time.sleep(0.05)
        for pid in self._children:  # past the grace: a worker stuck in shutdown
            _signal_quietly(pid, signal.SIGKILL)


def _signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class ProxyServer:
    """A proxy app served by a background thread. `port` is the bound one (useful with port=0)."""

    host: str | None
    port: int | None
    unix_path: str | None
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ValueError("this server listens on a Unix socket only")
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (in-flight requests get the runner's shutdown grace) and join the thread."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)


def serve_in_thread(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int | None = 0,
    unix_path: str | None = None,
    shutdown_timeout: float = 5.0,
    access_log: bool = False,
    startup_timeout: float = 10.0,
) -> ProxyServer:
    """Start serving `app` on a daemon thread with its own event loop; returns once it is listening.

    Raises what the startup raised (a port in use, say). `port=None` listens on `unix_path` only.
    """
    if port is None and unix_path is None:
        raise ValueError("serve_in_thread needs a port, a unix_path or both")
    loop = new_event_loop()
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        shutdown_timeout=shutdown_timeout,
    )
    started = threading.Event()
    outcome: dict[str, object] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            outcome["port"] = loop.run_until_complete(_start(runner, host, port, unix_path))
        except BaseException as exc:
            outcome["error"] = exc
            started.set()
            loop.close()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            _cancel_leftover_tasks(loop)
            loop.close()

    thread = threading.Thread(target=main, name="trove-proxy", daemon=True)
    thread.start()
    if not started.wait(startup_timeout):
        raise TimeoutError("the proxy did not start in time")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    bound_port = outcome["port"]
    assert bound_port is None or isinstance(bound_port, int)
    return ProxyServer(
        host=host if port is not None else None,
        port=bound_port,
        unix_path=unix_path,
        _loop=loop,
        _thread=thread,
    )


async def _start(runner: web.AppRunner, host: str, port: int | None, unix_path: str | None) -> int | None:
    await runner.setup()
    try:
        bound_port = None
        if port is not None:
            await web.TCPSite(runner, host, port).start()
            bound_port = next(addr[1] for addr in runner.addresses if isinstance(addr, tuple))
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
    except BaseException:
        await runner.cleanup()
        raise
    return bound_port


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    # Handlers still running after the shutdown grace (a hung upstream call) are cancelled and awaited,
    # so closing the loop leaves no pending task behind.
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
