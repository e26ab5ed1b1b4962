"""Shared fixtures. Everything here is real: Postgres (or SQLite in the embedded tests), Redis, bubblewrap,
the demo model server, the recording proxy and Celery workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.redis_keys import (
    describe_dead_letters,
    forget_queue,
    forget_stream,
    leftover_keys,
    queue_lists,
    remove_leftovers,
    unique_queue,
)

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = [p for p in ("tests.kube.fixtures",) if (REPO / (p.replace(".", "/") + ".py")).exists()]


# --- Redis: a test run leaves nothing behind ---------------------------------------------------------------


def _test_proxy_stream() -> str:
    """The proxy's stream during the tests: named after the test database (webapp/proxy/locations.py), known
    before pytest-django creates it and after it has been dropped."""
    from django.db import connections

    from webapp.proxy.locations import STREAM_PREFIX, slug

    if settings.TROVE_PROXY_STREAM:
        return settings.TROVE_PROXY_STREAM
    name = connections["default"].creation._get_test_db_name()
    return f"{STREAM_PREFIX}:{slug(Path(str(name)).name)}"


class RunRedis:
    """This run's place in the tests' Redis db: a client, the proxy's stream of the test database, and the
    queue that messages go to when a test routes them to no queue of its own."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.proxy_stream = _test_proxy_stream()
        self.default_queue = unique_queue("default")

    def drop_messages_of_the_default_queue(self) -> None:
        # Sent by a test to no worker (an API call that enqueues a rollout, say): they name rows of the test
        # database, which is emptied after each test, so they go with it. Only the message lists: the queue's
        # binding table stays until the end of the run.
        self.client.delete(*queue_lists(self.default_queue))


@pytest.fixture(scope="session")
def run_redis():
    """This run's Redis (None in the embedded default). At the end the run fails when keys it made are still
    there: its queues', its streams', the proxy stream's (tests/redis_keys.py names them all after the run),
    listing them; then they are removed."""
    if not settings.REDIS_URL:
        yield None
        return
    from webapp.celery import app

    run = RunRedis(settings.REDIS_URL)
    forget_stream(run.client, run.proxy_stream)  # a crashed earlier run's, on this same test database
    previous, app.conf.task_default_queue = app.conf.task_default_queue, run.default_queue
    yield run
    app.conf.task_default_queue = previous
    left = [key for key in leftover_keys(run.client, proxy_stream=run.proxy_stream) if run.default_queue not in key]
    dead = forget_stream(run.client, run.proxy_stream)
    forget_queue(run.client, run.default_queue)
    remove_leftovers(run.client, left)
    run.client.close()
    if left or dead:
        pytest.fail(f"this test run left {len(left)} key(s) in Redis {settings.REDIS_URL}: {', '.join(left)}"
                    + (f"; {describe_dead_letters(run.proxy_stream, dead)}" if dead else "")
                    + ". The fixture or test that made them must remove them (tests/redis_keys.py).", pytrace=False)


@pytest.fixture(autouse=True)
def redis_emptied_after_each_test(run_redis):
    """After each test: the proxy's stream of the test database emptied (its records name rows the test
    database drops), failing the test if the proxy dead-lettered any of them; the default queue's messages
    dropped."""
    yield
    if run_redis is not None:
        run_redis.drop_messages_of_the_default_queue()
        dead = forget_stream(run_redis.client, run_redis.proxy_stream)
        if dead:
            pytest.fail(describe_dead_letters(run_redis.proxy_stream, dead), pytrace=False)


@pytest.fixture
def sandbox_root():
    """A fresh sandbox root for the local backend, removed afterwards.

    Made under /tmp with mode 0711 (not under pytest's 0700 basetemp) so the unprivileged host uid that
    bubblewrap drops to can reach the workspaces.
    """
    root = Path(tempfile.mkdtemp(prefix="trove-sbx-", dir="/tmp"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_backend(sandbox_root, settings):
    from workers.sandboxes.local import LocalBackend
    from workers.sandboxes.registry import set_backend

    backend = LocalBackend(root=sandbox_root)
    settings.TROVE_SANDBOX_ROOT = sandbox_root
    set_backend("local", backend)
    yield backend
    for handle in backend.list({}):
        backend.destroy(handle.name)
    from workers.sandboxes import registry

    registry._backends.pop("local", None)


@pytest.fixture(scope="session")
def demo_model_url():
    from workers.demo.model import serve_in_thread

    url, stop = serve_in_thread("127.0.0.1", 0)
    yield url.rstrip("/").removesuffix("/v1") + "/v1"
    stop()


@pytest.fixture
def proxy(transactional_db, settings):
    """The recording proxy, wired to the test database, in a thread of this process."""
    from webapp.proxy.server import serve_in_thread
    from webapp.proxy.wiring import make_trove_proxy_app

    app, sink = make_trove_proxy_app()
    server = serve_in_thread(app, host="127.0.0.1", port=0)
    settings.TROVE_PROXY_PUBLIC_URL = server.base_url
    yield server
    sink.close()
    server.stop()


@pytest.fixture
def demo_fleet(transactional_db):
    from workers.seed import seed_local_fleet

    return seed_local_fleet(name=f"test-{uuid.uuid4().hex[:6]}", min_warm=0, max_warm=4, max_total=8)


@pytest.fixture
def demo_task_set(transactional_db):
    from workers.seed import seed_demo_task_set

    return seed_demo_task_set()


def _database_url_for_subprocess() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture
def celery_worker_process(transactional_db, proxy, sandbox_root, tmp_path, run_redis):
    """A real `celery worker` process on Redis, using this test's database, proxy and sandbox root.

    A unique queue keeps it from taking tasks of other test runs sharing the same Redis; its keys are
    removed afterwards.
    """
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql" or not settings.REDIS_URL:
        pytest.fail("the full-stack tests need DATABASE_URL (Postgres) and REDIS_URL: run them with `make test`")
    queue = unique_queue("worker")
    env = dict(
        os.environ,
        DATABASE_URL=_database_url_for_subprocess(),
        REDIS_URL=settings.REDIS_URL,
        TROVE_CELERY_QUEUE=queue,
        TROVE_PROXY_PUBLIC_URL=settings.TROVE_PROXY_PUBLIC_URL,
        TROVE_SANDBOX_ROOT=str(sandbox_root),
        SECRET_KEY="trove-test-secret",
    )
    log_path = tmp_path / "worker.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-P", "threads", "-c", "2", "-Q", queue,
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-n", f"{queue}@%h", "-l", "INFO"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    from webapp.celery import app

    previous, app.conf.task_default_queue = app.conf.task_default_queue, queue
    _wait_for_worker(app, queue, process, log_path)
    yield process
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()
    app.conf.task_default_queue = previous
    forget_queue(run_redis.client, queue)


def _wait_for_worker(app, queue: str, process, log_path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"celery worker exited: {log_path.read_text()[-3000:]}")
        if b"ready." in log_path.read_bytes():
            return
        time.sleep(0.2)
    raise RuntimeError(f"celery worker did not become ready: {log_path.read_text()[-3000:]}")


@pytest.fixture
def embedded_worker(transactional_db, settings):
    """The in-process worker thread on the memory transport (the embedded default's worker)."""
    from webapp.celery import app
    from workers.embedded import start_embedded_worker, stop_embedded_worker

    previous = app.conf.broker_url
    app.conf.broker_url = "memory://localhost/"
    start_embedded_worker(concurrency=2)
    yield
    stop_embedded_worker()
    app.conf.broker_url = previous


# --- external harnesses and failure tests -------------------------------------------------------------


class ModelUpstream:
    """The demo model behind a switch: counts the chat-completion requests it gets and, with `fault` set,
    fails them the way a model server does: "500" (an error answer), "hang" (no answer at all), or
    "broken_stream" (a streamed answer whose connection drops after the first chunk)."""

    FAULT_MESSAGE = "the model server exploded (an injected test fault)"

    def __init__(self, *, latency_s: float = 0.0) -> None:
        from webapp.proxy.server import serve_in_thread
        from workers.demo.model import make_app

        self.requests = 0
        self.fault: str | None = None
        app = make_app(latency_s=latency_s)
        app.middlewares.append(self._middleware())
        self._server = serve_in_thread(app, host="127.0.0.1", port=0, shutdown_timeout=0.5)
        self.url = f"{self._server.base_url}/v1"

    def _middleware(self):
        import asyncio

        from aiohttp import web

        @web.middleware
        async def middleware(request, handler):
            if not request.path.endswith("/chat/completions"):
                return await handler(request)
            self.requests += 1
            if self.fault == "500":
                return web.json_response({"error": {"message": self.FAULT_MESSAGE, "type": "server_error",
                                                    "code": "injected"}}, status=500)
            if self.fault == "hang":
                await asyncio.sleep(3600)
            if self.fault == "broken_stream":
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await response.write(b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
                                     b'[{"index":0,"delta":{"role":"assistant","content":"Let me"}}]}\n\n')
                request.transport.close()
                return response
            return await handler(request)

        return middleware

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def model_upstream():
    upstream = ModelUpstream()
    yield upstream
    upstream.stop()


@pytest.fixture
def slow_model_upstream():
    """The same with 0.3 s per reply, so a rollout lasts long enough to break it in the middle."""
    upstream = ModelUpstream(latency_s=0.3)
    yield upstream
    upstream.stop()


@pytest.fixture
def proxy_socket_path():
    """A Unix socket path in a directory of its own (the local backend binds the directory into sandboxes)."""
    directory = Path(tempfile.mkdtemp(prefix="trove-proxy-", dir="/tmp"))
    directory.chmod(0o755)
    yield str(directory / "proxy.sock")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def unix_proxy(transactional_db, settings, proxy_socket_path):
    """The recording proxy on TCP and on the Unix socket TROVE_PROXY_SOCKET (proxy-only local sandboxes reach
    it there), with a short upstream timeout so a hanging model server is noticed within a test."""
    from workers.stack import start_proxy

    server, sink = start_proxy(host="127.0.0.1", port=0, unix_path=proxy_socket_path, upstream_timeout=3.0)
    settings.TROVE_PROXY_PUBLIC_URL = server.base_url
    settings.TROVE_PROXY_SOCKET = proxy_socket_path
    yield server
    sink.close()
    server.stop()


@pytest.fixture
def proxy_only_fleet(transactional_db):
    """A local fleet whose sandboxes have no network but the recording proxy (for external harnesses)."""
    from webapp.fleets import services as fleet_services

    template = fleet_services.template_create(name=f"proxy-only-{uuid.uuid4().hex[:6]}", cpu=1.0, memory_mb=1024,
                                              pids=256, network="proxy-only", max_lifetime_s=3600,
                                              idle_timeout_s=900)
    return fleet_services.fleet_create(name=f"test-po-{uuid.uuid4().hex[:6]}", template=template, backend="local",
                                       min_warm=0, max_warm=4, max_total=8)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory):
    """A real tokenizer file (tests/experience/distill/rl_traffic.py trains it, deterministic), for the RL
    samples' tests: the stand-in token server's and the re-tokenised path's. Read only, so one per run."""
    from tests.experience.distill.rl_traffic import train_tokenizer

    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
