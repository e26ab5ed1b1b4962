"""One rollout, start to finish: claim a sandbox, set up the task, run the harness, evaluate, record.

Called by the Celery task `trove.rollouts.run` with a rollout id; safe to call twice for the same id
(the second call finds the rollout no longer queued and does nothing). Model calls are recorded by the
proxy; this module records the command, eval and sandbox steps.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import close_old_connections, connection

from experience.models import Step
from experience.records import StepRecord, TrajectoryRecord
from experience.services.ingest import steps_append, trajectory_finish, trajectory_open
from webapp.fleets.errors import StaleFencingToken
from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout
from workers import fleet_ops
from workers.harness.builtin import openai_chat, run_builtin_harness
from workers.sandboxes.base import ExecResult, SandboxError

log = logging.getLogger("trove.rollouts")
R = Rollout.Status
WORKSPACE_BASELINE = (
    "git init -q . && git add -A && "
    "git -c user.email=trove@localhost -c user.name=trove commit -q -m baseline"
)
PROXY_RECORD_WAIT_S = 15.0
EVAL_PROTECTED = ("tests/",)  # task files restored before the evaluation runs


class InfraFailure(SandboxError):
    """Infrastructure (model server, sandbox) failed during the harness; retried if transient."""


class RolloutCancelled(Exception):
    """The rollout was cancelled or taken back by the reaper while this worker was running it."""


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Clock:
    """Where a rollout's wall time went, so scheduling overhead (the rest) can be measured."""

    started: float = field(default_factory=time.perf_counter)
    model_ms: float = 0.0
    sandbox_ms: float = 0.0
    eval_ms: float = 0.0

    def as_dict(self) -> dict:
        total = (time.perf_counter() - self.started) * 1000
        return {"model_ms": round(self.model_ms, 1), "sandbox_ms": round(self.sandbox_ms, 1),
                "eval_ms": round(self.eval_ms, 1), "total_ms": round(total, 1)}


class Heartbeat:
    """Keeps the rollout (and its sandbox lease) alive from a thread; notices cancellation."""

    def __init__(self, rollout_id: int, worker: str, interval: float) -> None:
        self.rollout_id, self.worker, self.interval = rollout_id, worker, interval
        self.lease: fleet_ops.Lease | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{rollout_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not rollout_services.rollout_heartbeat(rollout_id=self.rollout_id, worker=self.worker):
                    self.lost.set()
                    return
                if self.lease:
                    fleet_ops.fleet_services.sandbox_heartbeat(
                        sandbox_id=self.lease.sandbox.pk, fencing_token=self.lease.fencing_token,
                        lease_seconds=fleet_ops.DEFAULT_LEASE_S,
                    )
        finally:
            connection.close()

    def check(self) -> None:
        if self.lost.is_set():
            raise RolloutCancelled(f"rollout {self.rollout_id} is no longer held by {self.worker}")


def rollout_run(*, rollout_id: int, worker: str) -> str | None:
    """Run a queued rollout. Returns its final status, or None if it was not ours to run."""
    close_old_connections()
    rollout = rollout_services.rollout_start(rollout_id=rollout_id, worker=worker)
    if rollout is None:
        return None
    trajectory = _open_trajectory(rollout)
    Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory)
    rollout.trajectory = trajectory
    with Heartbeat(rollout.pk, worker, settings.TROVE_ROLLOUT_HEARTBEAT_S) as heartbeat:
        return _run_attempt(rollout, worker, heartbeat)


def _open_trajectory(rollout: Rollout):
    job, task = rollout.job, rollout.task
    return trajectory_open(record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_version="1",
        source_ref=f"rollout:{rollout.pk}:attempt:{rollout.attempt}",
        task_set=job.task_set.name, task_key=task.key, instruction=task.instruction,
        harness=job.harness, model=job.model_name, status="running", started_at=now(),
        metadata={"job_id": job.pk, "rollout_id": rollout.pk, "sample_index": rollout.sample_index,
                  "attempt": rollout.attempt, "fleet": job.fleet.name,
                  "template": str(job.fleet.template), "template_spec_hash": job.fleet.template.spec_hash},
    ))


def _run_attempt(rollout: Rollout, worker: str, heartbeat: Heartbeat) -> str:
    clock, lease = Clock(), None
    try:
        lease = fleet_ops.sandbox_claim(fleet=rollout.job.fleet, holder=f"rollout:{rollout.pk}:{worker}")
        heartbeat.lease = lease
        Rollout.objects.filter(pk=rollout.pk).update(sandbox=lease.sandbox)
        _record(rollout, StepRecord(kind="sandbox_event", started_at=now(), text=_lease_note(lease),
                                    payload={"sandbox": lease.sandbox.name, "cold": lease.sandbox.cold_claim}))
        _prepare_workspace(rollout, lease, clock)
        steps = _run_harness(rollout, lease, heartbeat, clock)
        return _evaluate_and_finish(rollout, worker, lease, clock, steps)
    except (RolloutCancelled, StaleFencingToken) as error:
        _finish_trajectory(rollout, "cancelled", note=str(error))
        return R.CANCELLED
    except SandboxError as error:
        return _infra_failure(rollout, worker, error, clock)
    finally:
        if lease is not None:
            _release(lease)


def _lease_note(lease: fleet_ops.Lease) -> str:
    kind = "cold (created on demand)" if lease.sandbox.cold_claim else "warm"
    return f"leased {kind} sandbox {lease.sandbox.name} (fencing token {lease.fencing_token})"


def _prepare_workspace(rollout: Rollout, lease: fleet_ops.Lease, clock: Clock) -> None:
    started = time.perf_counter()
    fleet_ops.sandbox_write_files(lease, rollout.task.files)
    for command in [*rollout.task.setup_commands, WORKSPACE_BASELINE]:
        result = fleet_ops.sandbox_exec(lease, command, timeout=120, reason="setup")
        if result.exit_code != 0 and command != WORKSPACE_BASELINE:
            raise SandboxError(f"setup command failed ({result.exit_code}): {command}: {result.stderr[-500:]}",
                               reason="setup_failed", permanent=True)
    clock.sandbox_ms += (time.perf_counter() - started) * 1000


def _run_harness(rollout: Rollout, lease: fleet_ops.Lease, heartbeat: Heartbeat, clock: Clock) -> int:
    job = rollout.job
    calls = {"n": 0}
    base_chat = openai_chat(
        f"{settings.TROVE_PROXY_PUBLIC_URL}/r/{rollout.token}/v1", job.model_name, "trove-rollout-token",
        seed=job.pk * 100_003 + rollout.sample_index * 7 + rollout.attempt, timeout=120,
    )

    def chat(messages):
        heartbeat.check()
        started = time.perf_counter()
        try:
            return base_chat(messages)
        finally:
            calls["n"] += 1
            clock.model_ms += (time.perf_counter() - started) * 1000

    def execute(command: str) -> ExecResult:
        heartbeat.check()
        started = time.perf_counter()
        try:
            return fleet_ops.sandbox_exec(lease, command, timeout=60, idle_timeout=30, reason="harness")
        finally:
            clock.sandbox_ms += (time.perf_counter() - started) * 1000

    def on_command(command: str, result: ExecResult, started_at: datetime, ended_at: datetime) -> None:
        _record(rollout, _command_step(command, result, started_at, ended_at))

    outcome = run_builtin_harness(
        instruction=rollout.task.instruction, chat=chat, execute=execute, max_steps=job.max_steps,
        on_command=on_command, max_total_tokens=job.max_tokens,
    )
    _wait_for_model_calls(rollout.trajectory_id, calls["n"])
    if outcome.reason in ("model_error", "sandbox_error"):
        # The model server or the sandbox failed, not the agent: this run must not become training data.
        raise InfraFailure(f"{outcome.reason}: {outcome.error}",
                           permanent=bool(getattr(outcome.exception, "permanent", False)))
    _record(rollout, StepRecord(kind="note", started_at=now(), text=f"harness ended: {outcome.reason}",
                                payload={"reason": outcome.reason, "steps": outcome.steps}))
    return outcome.steps


def _command_step(command: str, result: ExecResult, started_at: datetime, ended_at: datetime) -> StepRecord:
    output = result.stdout + (("\n" + result.stderr) if result.stderr else "")
    return StepRecord(
        kind="command", command=command, output=output, exit_code=result.exit_code,
        started_at=started_at, ended_at=ended_at, duration_ms=result.duration_ms,
        is_error=result.timed_out,
        payload={"stdout_chars": len(result.stdout), "stderr_chars": len(result.stderr),
                 "timed_out": result.timed_out, "idle_timed_out": result.idle_timed_out,
                 "truncated_bytes": result.truncated_bytes},
    )


def _wait_for_model_calls(trajectory_id: int, expected: int) -> None:
    """The proxy records calls off the request path; give its writer a moment to catch up."""
    deadline = time.monotonic() + PROXY_RECORD_WAIT_S
    while time.monotonic() < deadline:
        if Step.objects.filter(trajectory_id=trajectory_id, kind="model_call").count() >= expected:
            return
        time.sleep(0.05)
    log.warning("trajectory %s: proxy recorded fewer than %s model calls in time", trajectory_id, expected)


def _evaluate_and_finish(rollout: Rollout, worker: str, lease, clock: Clock, steps: int) -> str:
    task = rollout.task
    diff = fleet_ops.sandbox_exec(lease, "git add -A >/dev/null 2>&1; git diff --cached", timeout=30, reason="diff")
    # The evaluation runs the task's own tests, whatever the agent did to its copy of them.
    fleet_ops.sandbox_write_files(lease, {p: t for p, t in task.files.items() if p.startswith(EVAL_PROTECTED)})
    started_at, started = now(), time.perf_counter()
    result = fleet_ops.sandbox_exec(lease, task.eval_command, timeout=task.eval_timeout_s, reason="eval")
    clock.eval_ms += (time.perf_counter() - started) * 1000
    passed = result.exit_code == 0 and not result.timed_out
    reward = 1.0 if passed else 0.0
    verdict = "passed" if passed else ("timed out" if result.timed_out else f"failed (exit {result.exit_code})")
    _record(rollout, StepRecord(
        kind="eval", command=task.eval_command, output=result.stdout + result.stderr, exit_code=result.exit_code,
        started_at=started_at, ended_at=now(), duration_ms=result.duration_ms, is_error=result.timed_out,
        text=f"evaluation {verdict}; reward {reward}",
        payload={"reward": reward, "timed_out": result.timed_out, "timeout_s": task.eval_timeout_s},
    ))
    trajectory_finish(trajectory_id=rollout.trajectory_id, status="completed", reward=reward, success=passed,
                      final_diff=diff.stdout if diff.exit_code == 0 else "")
    status = R.SUCCEEDED if passed else R.FAILED
    rollout_services.rollout_finish(
        rollout_id=rollout.pk, worker=worker, status=status, reward=reward, steps=steps,
        eval_output=(result.stdout + result.stderr)[-4000:], eval_timed_out=result.timed_out,
        timings=clock.as_dict(),
    )
    return status


def _infra_failure(rollout: Rollout, worker: str, error: SandboxError, clock: Clock) -> str:
    """Infrastructure failed, not the model: retry transient errors while attempts remain, else infra_error."""
    message = f"{error.reason}: {error}"
    _finish_trajectory(rollout, "infra_error", note=message)
    if not error.permanent and rollout.attempt < settings.TROVE_ROLLOUT_MAX_ATTEMPTS:
        if rollout_services.rollout_requeue(rollout_id=rollout.pk, worker=worker, error=message):
            return R.QUEUED
    rollout_services.rollout_finish(rollout_id=rollout.pk, worker=worker, status=R.INFRA_ERROR,
                                    error=message[:4000], timings=clock.as_dict())
    return R.INFRA_ERROR


def _finish_trajectory(rollout: Rollout, status: str, *, note: str) -> None:
    _record(rollout, StepRecord(kind="note", started_at=now(), text=note, is_error=True))
    trajectory_finish(trajectory_id=rollout.trajectory_id, status=status)


def _record(rollout: Rollout, step: StepRecord) -> None:
    steps_append(trajectory_id=rollout.trajectory_id, steps=[step])


def _release(lease: fleet_ops.Lease) -> None:
    try:
        fleet_ops.sandbox_release(lease)
    except SandboxError as error:  # the reconciler reaps what could not be destroyed now
        log.warning("release of %s failed: %s", lease.sandbox.name, error)
