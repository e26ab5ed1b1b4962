"""External harnesses: the example CLI agent (workers/harness/examples/mini_agent.py) on the host against the
demo model, and through the rollout runner inside a proxy-only bubblewrap sandbox, its calls recorded by the
recording proxy."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from experience.models import Trajectory
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.fleets.models import Sandbox
from webapp.proxy.recorder import RedisStreamSink
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_cancel, job_create, taskset_upsert
from workers.demo.tasks import get_demo_task
from workers.harness.external import server_failure
from workers.rollout_runner import PROXY_RECORD_QUIET_S, rollout_run
from workers.sandboxes.base import SandboxError

MINI_AGENT = Path(__file__).resolve().parents[2] / "workers" / "harness" / "examples" / "mini_agent.py"
IN_SANDBOX = "python3 /opt/trove/harness/mini_agent.py"
MODEL = "trove-demo-stand-in"
FAULT_MESSAGE = "the model server exploded (an injected test fault)"  # tests/conftest.py ModelUpstream


# --- the harness on its own -------------------------------------------------------------------------------

def run_mini_agent(workspace: Path, base_url: str, *, stream: bool = False, seed: int = 1) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENAI_BASE_URL=base_url, OPENAI_MODEL=MODEL, TROVE_SEED=str(seed),
               TROVE_INSTRUCTION_FILE=str(workspace / ".instruction.md"), MINI_AGENT_STREAM="1" if stream else "0")
    return subprocess.run([sys.executable, str(MINI_AGENT)], cwd=workspace, env=env, capture_output=True,
                          text=True, timeout=120)


def demo_workspace(tmp_path: Path, key: str = "slugify") -> tuple[Path, str]:
    task = get_demo_task(key)
    for path, text in task.files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / ".instruction.md").write_text(task.instruction)
    return tmp_path, task.eval_command


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_mini_agent_fixes_a_demo_task_talking_to_the_demo_model(tmp_path, model_upstream, stream):
    workspace, eval_command = demo_workspace(tmp_path)

    done = run_mini_agent(workspace, model_upstream.url, stream=stream)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted after" in done.stdout
    assert done.stdout.count("step ") == model_upstream.requests
    for path, text in get_demo_task("slugify").eval_files.items():  # copied in for the evaluation only
        (workspace / path).write_text(text)
    assert subprocess.run(["bash", "-c", eval_command], cwd=workspace).returncode == 0


@pytest.mark.parametrize(("fault", "stream", "said"), [
    ("500", False, f'model error: HTTP 500: {{"error": {{"message": "{FAULT_MESSAGE}"'),
    ("broken_stream", True, "model error: the stream ended before [DONE]"),
], ids=["500", "broken-stream"])
def test_the_mini_agent_stops_on_a_model_server_failure_and_prints_it_as_given(tmp_path, model_upstream, fault,
                                                                                stream, said):
    workspace, _ = demo_workspace(tmp_path)
    model_upstream.fault = fault

    done = run_mini_agent(workspace, model_upstream.url, stream=stream)

    assert done.returncode == 3
    assert said in done.stdout
    assert model_upstream.requests == 1


def test_a_model_server_failure_is_told_apart_from_the_harnesss_own_bad_request():
    def failure(kind: str, status: int):
        return server_failure(is_error=True, payload={"error_kind": kind, "status_code": status, "error": "x"})

    assert failure("upstream_status", 500) and not failure("upstream_status", 500).permanent
    assert failure("upstream_status", 429) and failure("upstream_timeout", 504) and failure("stream_broken", 200)
    assert failure("upstream_status", 401).permanent  # a wrong key: another attempt would fail the same way
    assert failure("upstream_status", 400) is None  # the harness's request was bad: the agent's failure
    assert failure("client_disconnected", 200) is None
    assert server_failure(is_error=False, payload={"status_code": 200}) is None


# --- through the rollout runner, inside a sandbox -----------------------------------------------------------

def external_job(task_set, fleet, upstream_url, command=IN_SANDBOX, **options):
    return job_create(task_set=task_set, fleet=fleet, endpoint=make_endpoint(upstream_url, model_names=[MODEL]),
                      model_name=MODEL,
                      enqueue=lambda rollout_id: None, harness="external", harness_command=command, **options)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_external_harness_runs_in_a_proxy_only_sandbox_and_every_model_call_it_makes_is_recorded(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet, stream
):
    command = ("MINI_AGENT_STREAM=1 " if stream else "") + IN_SANDBOX
    job = external_job(demo_task_set, proxy_only_fleet, model_upstream.url, command, task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == rollout.status and status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED)
    trajectory = rollout.trajectory
    assert trajectory.status == Trajectory.Status.COMPLETED and trajectory.harness == "external"
    calls = list(trajectory.steps.filter(kind="model_call"))
    assert len(calls) == model_upstream.requests >= 3, "every call the harness made went through the proxy"
    assert all(c.payload["stream"] is stream and not c.is_error for c in calls)
    assert rollout.steps == len(calls) == trajectory.n_model_calls
    harness = trajectory.steps.get(kind="command", payload__harness="external")
    assert harness.payload["command"] == command
    # the sample's seed decides the demo policy's strategy: it submits (0) or wanders to the step budget (2)
    assert (harness.exit_code, harness.payload["output"].splitlines()[-1].split()[0]) in ((0, "submitted"), (2, "gave"))
    assert harness.payload["base_url"].endswith("/r/<token>/v1") and rollout.token not in str(harness.payload)
    kinds = list(trajectory.steps.order_by("seq").values_list("kind", flat=True))
    assert kinds[-1] == "eval"
    assert ".trove-instruction" not in trajectory.final_diff, "the staged instruction never reaches the diff"
    assert rollout.timings["model_ms"] > 0 and rollout.timings["sandbox_ms"] > 0
    assert not Sandbox.objects.exclude(state=Sandbox.State.TERMINATED).exists()
    assert local_backend.list({}) == []


@pytest.mark.django_db(transaction=True)
def test_a_harness_that_exits_non_zero_after_working_with_the_model_is_the_agents_failure_and_is_evaluated(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet
):
    job = external_job(demo_task_set, proxy_only_fleet, model_upstream.url,
                       f'{IN_SANDBOX} --max-steps 1; echo "giving up on $TROVE_TASK_KEY"; exit 7', task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.FAILED and rollout.attempt == 1 and rollout.reward == 0.0
    harness = rollout.trajectory.steps.get(kind="command")
    assert harness.exit_code == 7 and "giving up on slugify" in harness.payload["output"]
    assert rollout.steps == 1 == rollout.trajectory.steps.filter(kind="model_call").count()
    assert rollout.trajectory.steps.filter(kind="eval").exists()
    assert rollout.trajectory.status == Trajectory.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the proxy counts admitted calls in Redis")
def test_a_call_whose_record_reaches_the_store_long_after_the_harness_exited_is_not_lost(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet, monkeypatch
):
    # The proxy is slow to record: each record reaches its sink well after the harness had its answer and
    # exited, and after the old settling wait (the count quiet for PROXY_RECORD_QUIET_S) would have given up.
    put = RedisStreamSink.put

    def slow_put(self, record):
        threading.Timer(PROXY_RECORD_QUIET_S + 1.5, put, (self, record)).start()

    monkeypatch.setattr(RedisStreamSink, "put", slow_put)
    job = external_job(demo_task_set, proxy_only_fleet, model_upstream.url, f"{IN_SANDBOX} --max-steps 1; exit 7",
                       task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.FAILED and rollout.attempt == 1, rollout.error
    assert rollout.steps == 1 == rollout.trajectory.steps.filter(kind="model_call").count() == model_upstream.requests
    assert rollout.trajectory.steps.get(kind="command").payload["model_calls"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_harness_that_fails_without_reaching_the_model_is_an_infra_error_not_an_agent_failure(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet, settings
):
    settings.TROVE_ROLLOUT_MAX_ATTEMPTS = 1
    job = external_job(demo_task_set, proxy_only_fleet, model_upstream.url, "no-such-agent --task x",
                       task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.INFRA_ERROR and "harness_failed" in rollout.error
    assert "no-such-agent: command not found" in rollout.error
    assert rollout.trajectory.status == Trajectory.Status.INFRA_ERROR
    assert not rollout.trajectory.steps.filter(kind="eval").exists()


@pytest.mark.django_db(transaction=True)
def test_an_external_harness_on_a_fleet_with_no_route_to_the_proxy_is_refused_before_a_sandbox_is_taken(
    local_backend, unix_proxy, model_upstream, demo_task_set, demo_fleet
):
    job = external_job(demo_task_set, demo_fleet, model_upstream.url, task_keys=["slugify"])
    rollout = job.rollouts.get()

    status = rollout_run(rollout_id=rollout.pk, worker="test-worker")

    rollout.refresh_from_db()
    assert status == Rollout.Status.INFRA_ERROR and rollout.attempt == 1, "permanent: not retried"
    assert "no_proxy_route" in rollout.error and "proxy-only" in rollout.error
    assert not Sandbox.objects.filter(fleet=demo_fleet).exists()
    assert rollout.trajectory.status == Trajectory.Status.INFRA_ERROR


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_rollout_kills_its_running_external_harness(
    local_backend, unix_proxy, model_upstream, demo_task_set, proxy_only_fleet, settings
):
    settings.TROVE_ROLLOUT_HEARTBEAT_S = 1
    task_set = taskset_upsert(name="long-harness", description="", source="api", tasks=[{
        "key": "waits", "instruction": "Wait.", "eval_command": "true", "files": {"README.md": "x\n"}}])
    job = external_job(task_set, proxy_only_fleet, model_upstream.url, "echo started; exec sleep 600",
                       wall_time_s=900)
    rollout = job.rollouts.get()
    outcome: list[str | None] = []

    def run() -> None:
        try:
            outcome.append(rollout_run(rollout_id=rollout.pk, worker="w"))
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    sandbox_dir = wait_for_harness(local_backend, rollout)

    job_cancel(job=job)
    runner.join(timeout=120)

    assert outcome == [Rollout.Status.CANCELLED]
    rollout.refresh_from_db()
    harness = rollout.trajectory.steps.get(kind="command")
    assert harness.payload["reason"] == "cancelled" and harness.exit_code != 0
    assert rollout.trajectory.status == Trajectory.Status.CANCELLED
    assert not sandbox_dir.exists() and local_backend.list({}) == []


def wait_for_harness(backend, rollout: Rollout, timeout: float = 60) -> Path:
    """The sandbox directory of the rollout once its harness is running (its pid file is written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for handle in backend.list({}):
            try:
                if backend.exec(handle, "test -s /tmp/trove/harness.pid").exit_code == 0:
                    return Path(handle.details["dir"])
            except SandboxError:
                pass  # still starting
        time.sleep(0.2)
    raise AssertionError(f"the harness of rollout {rollout.pk} did not start")
