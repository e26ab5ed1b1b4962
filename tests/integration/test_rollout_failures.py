"""Rollouts when things break, for real: a Celery worker killed with SIGKILL mid-rollout, Redis killed and
restarted in the middle of a job, and a model server that answers 500, hangs, or drops a stream.

Everything is real: Postgres, Redis (the shared one, or a private redis-server for the restart), celery worker
processes, bubblewrap sandboxes, the recording proxy and the demo model (behind a counting, fault-injecting
wrapper: tests/conftest.py ModelUpstream)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection

from experience.models import Step, Trajectory
from tests.redis_keys import forget_queue, unique_queue
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.celery import app as celery_app
from webapp.fleets.models import Sandbox
from webapp.proxy.wiring import ingest_pending_records
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import RUN_TASK, job_create, rollouts_stale
from workers.rollout_runner import rollout_run
from workers.sandboxes import procs
from workers.tasks.rollouts import enqueue_rollout, reap_stale_rollouts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
REPO = Path(__file__).resolve().parents[2]
MODEL = "trove-demo-stand-in"
FAULT_MESSAGE = "the model server exploded (an injected test fault)"  # tests/conftest.py ModelUpstream


# --- helpers ---------------------------------------------------------------------------------------------

class WorkerProcess:
    """A real `celery worker` process (threads pool) on its own queue, with this test's database, proxy and
    sandbox root; `kill()` sends SIGKILL."""

    def __init__(self, *, broker_url: str, queue: str, log_path: Path, sandbox_root: Path, proxy_url: str,
                 concurrency: int = 1, **env: str) -> None:
        db = django_settings.DATABASES["default"]
        environment = dict(
            os.environ, DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            REDIS_URL=broker_url, TROVE_CELERY_QUEUE=queue, TROVE_PROXY_PUBLIC_URL=proxy_url,
            TROVE_SANDBOX_ROOT=str(sandbox_root), SECRET_KEY="trove-test-secret", TROVE_ROLLOUT_HEARTBEAT_S="1",
            **env,
        )
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-P", "threads", "-c", str(concurrency),
             "-Q", queue, "--without-heartbeat", "--without-mingle", "--without-gossip",
             "-n", f"{queue}-{uuid.uuid4().hex[:4]}@%h", "-l", "INFO"],
            cwd=REPO, env=environment, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        size = self.log_path.stat().st_size
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited: {self.log_path.read_text()[-3000:]}")
            with open(self.log_path, "rb") as f:
                f.seek(size)
                if b"ready." in f.read():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"celery worker did not become ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no cleanup of any kind
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


class PrivateRedis:
    """A redis-server of this test's own on a free port, persisting every write (AOF, fsync always), so a
    SIGKILL and a restart lose nothing that was acknowledged."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("the private redis-server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


def demo_job(task_set, fleet, upstream_url, *, enqueue, task_keys, samples=1, **options) -> RolloutJob:
    return job_create(task_set=task_set, fleet=fleet, endpoint=make_endpoint(upstream_url, model_names=[MODEL]),
                      model_name=MODEL,
                      samples_per_task=samples, task_keys=task_keys, enqueue=enqueue, **options)


def wait_until(condition, *, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def job_completed(job: RolloutJob) -> bool:
    job.refresh_from_db()
    return job.status == RolloutJob.Status.COMPLETED


def model_calls(**filters) -> list[Step]:
    """Model-call steps, after storing the proxy's records still waiting in its Redis stream (what beat's
    `trove.proxy.ingest` does every second on the full stack, and a runner does while it waits)."""
    ingest_pending_records(0.2)
    return list(Step.objects.filter(kind="model_call", **filters).order_by("trajectory_id", "seq"))


def attempts_of(rollout: Rollout) -> list[Trajectory]:
    return list(Trajectory.objects.filter(source="rollout", source_ref__startswith=f"rollout:{rollout.pk}:attempt:")
                .order_by("source_ref"))


def assert_no_sandbox_left(backend, sandbox_root: Path) -> None:
    assert not Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).exists()
    assert backend.list({}) == []
    assert [p.name for p in sandbox_root.iterdir() if not p.name.startswith(".")] == []
    assert procs.processes_mentioning(str(sandbox_root) + "/") == [], "a sandbox process is still running"


@pytest.fixture
def shared_queue(run_redis):
    """A unique queue on the shared Redis for this test's workers; the reaper enqueues there too. Its keys
    are removed afterwards."""
    queue = unique_queue("shared")
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = queue
    yield queue
    celery_app.conf.task_default_queue = previous
    forget_queue(run_redis.client, queue)


# --- a worker killed mid-rollout -------------------------------------------------------------------------------

def test_a_rollout_whose_worker_is_killed_is_reaped_retried_once_and_recorded_once(
    proxy, local_backend, sandbox_root, demo_task_set, demo_fleet, shared_queue, slow_model_upstream, tmp_path,
    settings
):
    settings.TROVE_ROLLOUT_STALE_S = 3
    upstream = slow_model_upstream
    workers: list[WorkerProcess] = []

    def start_worker() -> None:
        workers.append(WorkerProcess(broker_url=django_settings.REDIS_URL, queue=shared_queue,
                                     log_path=tmp_path / "worker.log", sandbox_root=sandbox_root,
                                     proxy_url=proxy.base_url))

    try:
        start_worker()
        job = demo_job(demo_task_set, demo_fleet, upstream.url, enqueue=enqueue_rollout, task_keys=["slugify"],
                       max_steps=20)
        rollout = job.rollouts.get()
        first = wait_until(lambda: Rollout.objects.filter(pk=rollout.pk).exclude(sandbox=None).first(),
                           timeout=120, what="the rollout to take a sandbox")
        wait_until(lambda: upstream.requests >= 2, timeout=120, what="the harness's second model call")
        sandbox = Sandbox.objects.get(pk=first.sandbox_id)

        workers[0].kill()
        sandbox_dir = sandbox_root / sandbox.name
        assert sandbox_dir.exists() and procs.processes_mentioning(str(sandbox_dir) + "/"), \
            "the sandbox outlives its worker (it does not depend on its creator)"
        wait_until(lambda: [r for r in rollouts_stale() if r.pk == rollout.pk], timeout=30,
                   what="the rollout's heartbeat to go stale")
        reaped = reap_stale_rollouts()
        start_worker()
        wait_until(lambda: job_completed(job), timeout=240, what="the job to complete")
    finally:
        for worker in workers:
            worker.stop()

    assert reaped == {"requeued": 1, "infra_error": 0, "resent": 0}
    rollout.refresh_from_db()
    assert rollout.status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED) and rollout.attempt == 2
    old, new = attempts_of(rollout)
    assert old.status == Trajectory.Status.INFRA_ERROR, "the killed attempt is kept, out of training data"
    assert new.pk == rollout.trajectory_id and new.status == Trajectory.Status.COMPLETED
    wait_until(lambda: len(model_calls(trajectory_id__in=[old.pk, new.pk])) >= upstream.requests, timeout=30,
               what="every call to be stored")
    calls = model_calls(trajectory_id__in=[old.pk, new.pk])
    assert len(calls) == upstream.requests, "every call made, by either attempt, is recorded exactly once"
    assert len({c.call_id for c in calls}) == len(calls)
    assert all(c.started_at >= new.started_at for c in calls if c.trajectory_id == new.pk), \
        "no call of the killed attempt landed in the new attempt's trajectory"
    assert new.steps.filter(kind="eval").count() == 1 and not old.steps.filter(kind="eval").exists()
    sandbox.refresh_from_db()
    assert sandbox.state == Sandbox.State.TERMINATED and not sandbox_dir.exists()
    assert_no_sandbox_left(local_backend, sandbox_root)


def test_a_rollout_whose_worker_dies_on_its_last_attempt_ends_as_infra_error(
    proxy, local_backend, sandbox_root, demo_task_set, demo_fleet, shared_queue, slow_model_upstream, tmp_path,
    settings
):
    settings.TROVE_ROLLOUT_STALE_S = 3
    settings.TROVE_ROLLOUT_MAX_ATTEMPTS = 1
    upstream = slow_model_upstream
    worker = WorkerProcess(broker_url=django_settings.REDIS_URL, queue=shared_queue, log_path=tmp_path / "w.log",
                           sandbox_root=sandbox_root, proxy_url=proxy.base_url)
    try:
        job = demo_job(demo_task_set, demo_fleet, upstream.url, enqueue=enqueue_rollout, task_keys=["slugify"])
        rollout = job.rollouts.get()
        wait_until(lambda: upstream.requests >= 1, timeout=120, what="a model call")
        worker.kill()
        wait_until(lambda: [r for r in rollouts_stale() if r.pk == rollout.pk], timeout=30, what="a stale heartbeat")
        reaped = reap_stale_rollouts()
    finally:
        worker.stop()

    assert reaped == {"requeued": 0, "infra_error": 1, "resent": 0}
    rollout.refresh_from_db()
    job.refresh_from_db()
    assert rollout.status == Rollout.Status.INFRA_ERROR and "stopped heartbeating" in rollout.error
    assert rollout.trajectory.status == Trajectory.Status.INFRA_ERROR
    assert job.status == RolloutJob.Status.COMPLETED
    assert_no_sandbox_left(local_backend, sandbox_root)


# --- Redis restarted in the middle of a job -------------------------------------------------------------------

def test_a_job_survives_a_redis_restart_and_every_model_call_is_in_the_store(
    local_backend, sandbox_root, demo_task_set, demo_fleet, slow_model_upstream, tmp_path, settings
):
    from webapp.proxy.locations import proxy_stream
    from webapp.proxy.recorder import RedisStreamSink
    from webapp.proxy.server import serve_in_thread
    from webapp.proxy.wiring import make_trove_proxy_app

    broker = PrivateRedis(tmp_path)
    settings.REDIS_URL = broker.url  # this process's ingest (beat's stand-in) reads the private Redis too
    queue = f"trove-test-{uuid.uuid4().hex[:8]}"
    upstream = slow_model_upstream
    sink = RedisStreamSink(url=broker.url, spool_dir=tmp_path / "spool", stream=proxy_stream(), retry_interval_s=1.0)
    app, _ = make_trove_proxy_app(sink=sink)
    proxy = serve_in_thread(app, host="127.0.0.1", port=0)
    ingest = BeatIngest()
    worker = None
    try:
        worker = WorkerProcess(broker_url=broker.url, queue=queue, log_path=tmp_path / "worker.log",
                               sandbox_root=sandbox_root, proxy_url=proxy.base_url, concurrency=2)
        job = demo_job(demo_task_set, demo_fleet, upstream.url, enqueue=lambda rid: send_to(broker.url, queue, rid),
                       task_keys=["calc_expr", "roman_numerals", "slugify"], samples=2, max_steps=20)
        wait_until(lambda: len(model_calls(trajectory__metadata__job_id=job.pk)) >= 4, timeout=120,
                   what="the job to get going")

        broker.kill()
        time.sleep(3)  # calls go on meanwhile: the proxy spools their records, the workers cannot reach Redis
        broker.start()

        wait_until(lambda: job_completed(job), timeout=300, what="the job to complete after the restart")
        wait_until(lambda: len(model_calls(trajectory__metadata__job_id=job.pk)) == upstream.requests, timeout=60,
                   what="every model call to reach the store")
    finally:
        if worker is not None:
            worker.stop()
        ingest.stop()
        sink.close()
        proxy.stop()
        broker.stop()

    assert sink.spooled > 0, "the outage happened while calls were being made"
    statuses = set(job.rollouts.values_list("status", flat=True))
    assert job.rollouts.count() == 6 and statuses <= {Rollout.Status.SUCCEEDED, Rollout.Status.FAILED}
    calls = model_calls(trajectory__metadata__job_id=job.pk)
    assert len(calls) == upstream.requests and len({c.call_id for c in calls}) == len(calls)
    assert_no_sandbox_left(local_backend, sandbox_root)


def send_to(broker_url: str, queue: str, rollout_id: int) -> None:
    with celery_app.connection_for_write(broker_url) as conn:
        celery_app.send_task(RUN_TASK, args=(rollout_id,), queue=queue, connection=conn)


class BeatIngest:
    """Beat's stand-in: the proxy's record ingest task (`trove.proxy.ingest`) run every second on a thread,
    through the Redis outage (the task reports Redis errors and the next tick tries again)."""

    def __init__(self) -> None:
        from workers.tasks.proxy import ingest_proxy_records

        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(1.0):
                ingest_proxy_records(max_seconds=1.0)
            connection.close()

        self._thread = threading.Thread(target=run, name="stream-ingest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# --- a model server that fails -------------------------------------------------------------------------------

BUILTIN_CALLS_PER_ATTEMPT = 3  # the built-in harness's client retries a 5xx or a timeout twice


@pytest.mark.parametrize(("harness", "fault", "error_kind", "told"), [
    ("builtin", "500", "upstream_status", f"HTTP 500: {FAULT_MESSAGE}"),
    ("builtin", "hang", "upstream_timeout", "HTTP 504: the upstream sent nothing for 3.0s"),
    ("external", "500", "upstream_status", f'HTTP 500: {{"error": {{"message": "{FAULT_MESSAGE}"'),
    ("external", "broken_stream", "stream_broken", "the stream ended before [DONE]"),
], ids=["builtin-500", "builtin-hang", "external-500", "external-broken-stream"])
def test_a_failing_model_server_is_recorded_as_error_steps_and_ends_the_rollout_as_infra_error_after_capped_retries(
    local_backend, unix_proxy, model_upstream, demo_task_set, demo_fleet, proxy_only_fleet, sandbox_root, settings,
    harness, fault, error_kind, told
):
    settings.TROVE_ROLLOUT_MAX_ATTEMPTS = 2
    model_upstream.fault = fault
    options = {"harness": "external", "harness_command": "MINI_AGENT_STREAM=1 python3 /opt/trove/harness/mini_agent.py"
               if fault == "broken_stream" else "python3 /opt/trove/harness/mini_agent.py"} if harness == "external" else {}
    fleet = proxy_only_fleet if harness == "external" else demo_fleet
    job = demo_job(demo_task_set, fleet, model_upstream.url, enqueue=lambda rid: None, task_keys=["slugify"], **options)
    rollout = job.rollouts.get()

    outcomes = [rollout_run(rollout_id=rollout.pk, worker="w") for _ in range(3)]
    per_attempt = BUILTIN_CALLS_PER_ATTEMPT if harness == "builtin" else 1
    wait_until(lambda: len(model_calls(trajectory__metadata__rollout_id=rollout.pk)) >= 2 * per_attempt,
               timeout=30, what="the proxy to record the calls")

    assert outcomes == [Rollout.Status.QUEUED, Rollout.Status.INFRA_ERROR, None], "retried once, then no more"
    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.INFRA_ERROR and rollout.attempt == 2 and rollout.reward is None
    trajectories = attempts_of(rollout)
    assert [t.status for t in trajectories] == [Trajectory.Status.INFRA_ERROR] * 2
    calls = model_calls(trajectory__in=trajectories)
    assert len(calls) == model_upstream.requests == 2 * per_attempt, "every failed call is recorded, once"
    assert all(c.is_error and c.payload["error_kind"] == error_kind for c in calls)
    for trajectory in trajectories:
        assert not trajectory.steps.filter(kind="eval").exists(), "no evaluation of a run the model server broke"
    if harness == "builtin":
        assert told in rollout.error, "the harness got the failure as the model server (or the proxy) gave it"
    else:
        output = Step.objects.get(trajectory=trajectories[-1], kind="command").payload["output"]
        assert told in output, "the harness got the failure as the model server gave it"
        assert "model call failed" in rollout.error
    assert_no_sandbox_left(local_backend, sandbox_root)
