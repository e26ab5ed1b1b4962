"""One rollout, start to finish: claim a sandbox, set up the task, run the harness, evaluate, record.

Called by the Celery task `trove.rollouts.run` with a rollout id; safe to call twice for the same id
(the second call finds the rollout no longer queued and does nothing). Model calls are recorded by the
proxy; this module records the command, eval and sandbox steps.

Harnesses: `builtin` (the bash-acting loop in workers/harness/builtin.py, run here, its commands executed in
the sandbox), `external` (RolloutJob.harness_command run inside the sandbox, see workers/harness/external.py),
and the presets of the harness catalogue (`claude-code`, `codex@0.171.0`, ...: workers/harness/presets/), run
the external way from their installed bundle, their native logs collected and their own verdict heard.

Attempts: every attempt has its own trajectory and its own proxy token (a new token per attempt), so a model
call made by an earlier attempt's harness — still running in a sandbox not yet reaped — can only land in that
attempt's trajectory, never in the new one.

Steps: model calls are written by the proxy's writer; the runner's own (sandbox event, commands, notes, eval)
are buffered and written in batches (STEP_FLUSH_S). On the full stack the proxy's records travel through a
Redis stream: while the harness runs, a thread of the runner stores them as they come (RecordCatchUp), so a
running rollout's page shows its calls and the runner's wait for them, just before it finishes the
trajectory, rarely waits at all.

Timings (Rollout.timings): `total_ms` runs from the call of rollout_run to the rollout's final write,
`model_ms` is time in model calls, `sandbox_ms` the commands' own run time (setup, harness, diff and
evaluation preparation) and `eval_ms` the evaluation command's, both as the agent measured them inside the
sandbox (ExecResult.duration_ms). The rest is Trove's own overhead; two parts of it are also given apart:
`exec_wall_ms`, the exec round trips' wall time (the rest of each round trip, past the command's own time,
is the fence check, the exec log and the agent protocol), and `sandbox_lifecycle_ms`, a cold claim (the
sandbox's create) and the release (a single-use sandbox's destroy).
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction

from experience.models import Step
from experience.records import StepRecord, TrajectoryRecord
from experience.services.ingest import (
    Tally,
    steps_append,
    trajectory_finish,
    trajectory_open,
    trajectory_tally,
)
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import EnvironmentTemplate, Fleet
from webapp.fleets.services import relaxed_commit
from webapp.proxy.admission import GateCount
from webapp.proxy.wiring import close_and_count_admitted, ingest_pending_records
from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout
from workers import eval_integrity, fleet_ops
from workers.harness import external
from workers.harness.builtin import STEP_BUDGET, openai_chat, run_builtin_harness
from workers.harness.presets import rollout as preset_rollout
from workers.sandboxes.base import ExecResult, SandboxError
from workers.sandboxes.bwrap import PROXY_PORT

log = logging.getLogger("trove.rollouts")
R = Rollout.Status
# Trove's own git bookkeeping reads no system-wide git configuration (an image's /etc/gitconfig is not the task's).
WORKSPACE_BASELINE = (
    "export GIT_CONFIG_NOSYSTEM=1; git init -q . && git add -A && "
    "git -c user.email=trove@localhost -c user.name=trove commit -q -m baseline && git rev-parse HEAD"
)
PROXY_RECORD_WAIT_S = 15.0
# Full stack: how long one wait for the proxy's records may block on its stream. Short: a read that finds
# nothing blocks for all of it, and the records usually landed already.
INGEST_SLICE_S = 0.02
CATCH_UP_SLICE_S, CATCH_UP_IDLE_S = 0.2, 0.2  # the catch-up thread: one drain of the stream, the pause after
CATCH_UP_KEEP_S = 0.5  # ... and how long it keeps its connection with no rollout in a harness (between rollouts)
# An external harness does not say how many calls it made. The proxy counts the calls it admits
# (webapp/proxy/admission.py: in Redis, or in this process for the embedded proxy) and the runner waits for
# exactly that many; when the count is unknown its calls are taken as all recorded once the count of stored
# calls has not moved for this long after it exited (the proxy queues a
# call's record as soon as it has sent the answer, so what is left to cover is the record's way to the
# store: the sink's batching).
PROXY_RECORD_QUIET_S = 1.0
EVAL_PATCH_BYTES = 16 * 1024 * 1024  # the largest final diff carried into a fresh evaluation sandbox
# The runner's own steps are written in batches: at most this long after the first unwritten one (checked as
# steps come), and always before the trajectory is finished. A batch holds steps older than model calls the
# proxy already stored, so every write renumbers the trajectory's steps by time: fewer, larger batches are
# cheaper. A live page shows a running rollout's commands up to this late (its model calls, which carry the
# commands' output in their context, are shown as they land).
STEP_FLUSH_S = 5.0
HARNESS_OUTPUT_BYTES = 256 * 1024  # per stream, for an external harness's command step
# Threads kept for the bookkeeping an attempt does while its evaluation runs: starting a thread waits for it
# to be scheduled, on the rollout's critical path. Each job closes its database connection when done, so an
# idle thread holds none.
_BOOKKEEPING = futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="rollout-bookkeeping")


class InfraFailure(SandboxError):
    """Infrastructure (model server, sandbox) failed during the harness; retried if transient."""


class RolloutCancelled(Exception):
    """The rollout was cancelled or taken back by the reaper while this worker was running it."""


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Clock:
    """Where a rollout's wall time went, so Trove's own overhead (the rest) can be measured (see Timings)."""

    started: float = field(default_factory=time.perf_counter)
    model_ms: float = 0.0
    sandbox_ms: float = 0.0
    eval_ms: float = 0.0
    exec_wall_ms: float = 0.0
    sandbox_lifecycle_ms: float = 0.0

    def command(self, result: ExecResult, wall_ms: float, *, evaluation: bool = False) -> None:
        """One exec: the agent's own measure of the command is sandbox (or eval) time; the round trip's wall
        time is kept apart, so what Trove added around the command can be told."""
        if evaluation:
            self.eval_ms += result.duration_ms
        else:
            self.sandbox_ms += result.duration_ms
        self.exec_wall_ms += wall_ms

    def as_dict(self) -> dict:
        total = (time.perf_counter() - self.started) * 1000
        return {"model_ms": round(self.model_ms, 1), "sandbox_ms": round(self.sandbox_ms, 1),
                "eval_ms": round(self.eval_ms, 1), "exec_wall_ms": round(self.exec_wall_ms, 1),
                "sandbox_lifecycle_ms": round(self.sandbox_lifecycle_ms, 1), "total_ms": round(total, 1)}


class RecordCatchUp:
    """Full stack: stores the proxy's records waiting in its Redis stream, on a thread, while the harness
    runs. Beat's ingest task queues behind the rollouts of a busy job; without this a call would reach the
    store only when some rollout finished. Whatever it stores is any rollout's: the stream is shared.

    One thread per process, kept across rollouts with its database connection: it drains while at least one
    rollout is in its harness and waits otherwise, closing the connection once no rollout has run for
    CATCH_UP_KEEP_S. (A thread per rollout opened a new Postgres connection for every rollout, a few ms of
    the server's time each on a busy box.)"""

    _lock = threading.Lock()
    _running = 0  # rollouts of this process in their harness
    _wanted = threading.Event()  # set while _running > 0
    _owner_pid = 0  # the process that started the thread: a forked child starts its own

    def __init__(self) -> None:
        self._entered = False

    def __enter__(self) -> RecordCatchUp:
        if settings.REDIS_URL:
            cls = type(self)
            with cls._lock:
                cls._running += 1
                cls._wanted.set()
                if cls._owner_pid != os.getpid():
                    cls._owner_pid = os.getpid()
                    threading.Thread(target=cls._run, name="record-catch-up", daemon=True).start()
            self._entered = True
        return self

    def __exit__(self, *exc) -> None:
        # Not waited for: a drain under way finishes on its own (within a slice) while the evaluation runs.
        if self._entered:
            cls = type(self)
            with cls._lock:
                cls._running -= 1
                if cls._running == 0:
                    cls._wanted.clear()

    @classmethod
    def _run(cls) -> None:
        while True:
            if not cls._wanted.wait(CATCH_UP_KEEP_S):
                connection.close()  # the process has stopped running rollouts for now: hold nothing idle
                cls._wanted.wait()
            try:
                drained = ingest_pending_records(CATCH_UP_SLICE_S)
            except Exception:  # noqa: BLE001 (the thread outlives any one failure; the next drain retries)
                log.exception("record catch-up failed")
                connection.close_if_unusable_or_obsolete()  # a broken connection is replaced on the next use
                drained = 0
            if not drained:
                time.sleep(CATCH_UP_IDLE_S)


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


def rollout_run(*, rollout_id: int, worker: str, enqueue: rollout_services.Enqueue | None = None) -> str | None:
    """Run a queued rollout. Returns its final status (or `queued` when it was put back for another
    attempt), or None if it was not ours to run. `enqueue` sends the job's next waiting rollouts that this
    one's finish gives a slot to (default: a Celery message each; workers/tasks/rollouts.py keeps one to
    run itself)."""
    clock = Clock()
    close_old_connections()
    # One commit: the claim, the attempt's trajectory, and a token of its own (module docstring).
    rollout = rollout_services.rollout_start(rollout_id=rollout_id, worker=worker, open_trajectory=_open_trajectory)
    if rollout is None:
        return None
    with Heartbeat(rollout.pk, worker, settings.TROVE_ROLLOUT_HEARTBEAT_S) as heartbeat:
        return Attempt(rollout, worker, heartbeat, clock, enqueue).run()


def _open_trajectory(rollout: Rollout):
    job, task = rollout.job, rollout.task
    # Exclusive: inside the claim's transaction, an attempt already opened means another worker has it.
    return trajectory_open(exclusive=True, rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_version="1",
        source_ref=f"rollout:{rollout.pk}:attempt:{rollout.attempt}",
        task_set=job.task_set.name, task_key=task.key, instruction=task.instruction,
        harness=job.harness, model=job.model_name, status="running", started_at=now(),
        metadata={"job_id": job.pk, "rollout_id": rollout.pk, "sample_index": rollout.sample_index,
                  "attempt": rollout.attempt, "fleet": job.fleet.name, "harness_command": job.harness_command,
                  "model_endpoint": job.endpoint.name, "model_protocol": job.endpoint.protocol,
                  "model_base_url": job.endpoint.base_url, **preset_rollout.harness_facts(job.harness),
                  "template": str(job.fleet.template), "template_spec_hash": job.fleet.template.spec_hash},
    ))


def _claimed_proxy_token(rollout: Rollout) -> str:
    """The attempt's plaintext proxy token: rollout_start sets it on the object it claims, the database keeps
    only its hash, so a rollout fetched any other way has none."""
    token = getattr(rollout, "proxy_token", None)
    if not isinstance(token, str):
        raise RuntimeError(f"rollout {rollout.pk} carries no proxy token: only the object rollout_start claims has one")
    return token


class Attempt:
    """One attempt at a rollout, from the sandbox claim to the final status."""

    def __init__(self, rollout: Rollout, worker: str, heartbeat: Heartbeat, clock: Clock,
                 enqueue: rollout_services.Enqueue | None = None) -> None:
        self.rollout, self.worker, self.heartbeat, self.clock = rollout, worker, heartbeat, clock
        self.enqueue = enqueue
        self.job = rollout.job
        assert rollout.trajectory_id is not None, "rollout_run opens the attempt's trajectory first"
        self.trajectory_id: int = rollout.trajectory_id
        self.proxy_token = _claimed_proxy_token(rollout)
        self.lease: fleet_ops.Lease | None = None
        self.model_calls = 0  # calls the harness made, as far as the runner knows (waited for before finishing)
        self.pending: list[StepRecord] = []
        self.pending_since = 0.0
        self.eval_facts: dict = {}  # how the evaluation was made trustworthy, kept in its step
        self.baseline = "HEAD"  # the workspace's baseline commit (prepare_workspace)

    def run(self) -> str:
        try:
            self.claim()
            self.prepare_workspace()
            steps = self.run_harness()
            return self.evaluate_and_finish(steps)
        except (RolloutCancelled, StaleFencingToken) as error:
            self.finish_trajectory("cancelled", note=str(error))
            return R.CANCELLED
        except SandboxError as error:
            return self.infra_failure(error)
        finally:
            self.release()

    # --- steps of an attempt ---------------------------------------------------------------------------

    def claim(self) -> None:
        preset = preset_rollout.preset_of(self.job.harness)  # a name outside the catalogue: refused here
        if preset is not None and self.job.fleet.backend == "local":
            preset_rollout.check_installed(*preset, str(settings.TROVE_HARNESS_DIR))
        if self.job.harness != "builtin":
            _external_base_url(self.job.fleet)  # fail before taking a sandbox the harness could not use
        lease = fleet_ops.sandbox_claim(fleet=self.job.fleet, holder=f"rollout:{self.rollout.pk}:{self.worker}")
        self.lease = self.heartbeat.lease = lease
        if lease.sandbox.cold_claim:  # the wait was the sandbox being created, not scheduling
            self.clock.sandbox_lifecycle_ms += lease.claim_ms
        # A pointer for the reaper; the lease itself (already committed) guards the sandbox.
        rollout_services.rollout_set_sandbox(rollout_id=self.rollout.pk, sandbox_id=lease.sandbox.pk)
        self.record(StepRecord(kind="sandbox_event", started_at=now(), text=_lease_note(lease),
                               payload={"sandbox": lease.sandbox.name, "cold": lease.sandbox.cold_claim,
                                        "claim_ms": round(lease.claim_ms, 1)}))

    def prepare_workspace(self) -> None:
        lease, task = self.held(), self.rollout.task
        fleet_ops.sandbox_write_files(lease, task.files)
        for command in [*task.setup_commands, WORKSPACE_BASELINE]:
            result = self.exec(command, timeout=120, reason="setup")
            if result.exit_code != 0 and command != WORKSPACE_BASELINE:
                raise SandboxError(f"setup command failed ({result.exit_code}): {command}: {result.stderr[-500:]}",
                                   reason="setup_failed", permanent=True)
        # The diffs are taken against this commit, not HEAD: an agent may commit its work (or move HEAD).
        self.baseline = result.stdout.strip() if result.exit_code == 0 else "HEAD"

    def run_harness(self) -> int:
        """Run the job's harness; returns its step count (model turns). Raises InfraFailure when the model
        server or the sandbox failed rather than the agent."""
        with RecordCatchUp():
            if self.job.harness != "builtin":  # a custom command or a preset (checked in claim)
                return self.run_external()
            return self.run_builtin()

    def run_builtin(self) -> int:
        rollout, job, clock = self.rollout, self.job, self.clock
        calls = {"n": 0}
        base_chat = openai_chat(
            f"{settings.TROVE_PROXY_PUBLIC_URL}/r/{self.proxy_token}/v1", job.model_name, "trove-rollout-token",
            seed=_seed(rollout), timeout=120,
        )

        def chat(messages):
            self.heartbeat.check()
            started = time.perf_counter()
            try:
                return base_chat(messages)
            finally:
                calls["n"] += 1
                clock.model_ms += (time.perf_counter() - started) * 1000

        def execute(command: str) -> ExecResult:
            self.heartbeat.check()
            return self.exec(command, timeout=60, idle_timeout=30, reason="harness")

        def on_command(command: str, result: ExecResult, started_at: datetime, ended_at: datetime) -> None:
            self.record(_command_step(command, result, started_at, ended_at))

        outcome = run_builtin_harness(
            instruction=rollout.task.instruction, chat=chat, execute=execute, max_steps=job.max_steps,
            on_command=on_command, max_total_tokens=job.max_tokens,
        )
        self.model_calls = calls["n"]
        if outcome.reason in ("model_error", "sandbox_error"):
            # The model server or the sandbox failed, not the agent: this run must not become training data.
            raise InfraFailure(f"{outcome.reason}: {outcome.error}",
                               permanent=bool(getattr(outcome.exception, "permanent", False)))
        self.record(StepRecord(kind="note", started_at=now(), text=f"harness ended: {outcome.reason}",
                               payload={"reason": outcome.reason, "steps": outcome.steps}))
        return outcome.steps

    def run_external(self) -> int:
        rollout, job, lease = self.rollout, self.job, self.held()
        setup = external.HarnessSetup(
            base_url=_external_base_url(job.fleet) + f"/r/{self.proxy_token}/v1", model=job.model_name,
            seed=_seed(rollout), task_key=rollout.task.key, rollout_id=rollout.pk, max_steps=job.max_steps,
            max_tokens=job.max_tokens,
        )
        preset = preset_rollout.preset_of(job.harness)
        launch = preset_rollout.prepare(*preset, setup) if preset else None
        # A preset's script prints its native logs after the harness (launch.py): room for them, split off after.
        max_output = preset_rollout.harness_exec_output_bytes(HARNESS_OUTPUT_BYTES) if launch else HARNESS_OUTPUT_BYTES
        outcome = external.run_external_harness(
            command=launch.script if launch else job.harness_command, instruction=rollout.task.instruction,
            setup=setup, extra_env=launch.env if launch else None,
            stage_file=lambda path, text: fleet_ops.sandbox_write_files(lease, {path: text}),
            execute=lambda script: _closing_connection(fleet_ops.sandbox_exec, lease, script,
                                                       timeout=job.wall_time_s, max_output=max_output,
                                                       reason="external harness"),
            kill=lambda script: _kill_quietly(lease, script),
            should_stop=self.heartbeat.lost.is_set,
        )
        native_logs = None
        if launch is not None:
            outcome, native_logs = preset_rollout.split_harness_output(outcome, HARNESS_OUTPUT_BYTES)
        calls, refused = _settled_model_calls(self.trajectory_id, self.proxy_token)
        self.model_calls = len(calls)
        self.account_external(outcome, calls)
        # The proxy refused a call past the job's step budget: that, not how the harness took it, ended the run.
        reason = STEP_BUDGET if refused and not outcome.cancelled else outcome.reason
        self.record(_harness_step(launch.display if launch else job.harness_command, outcome,
                                  _external_base_url(job.fleet), len(calls), harness=job.harness, reason=reason))
        if outcome.cancelled:
            raise RolloutCancelled(f"rollout {rollout.pk} was taken away while its harness ran; harness killed")
        failure = _external_failure(outcome, calls)
        if failure is None and launch is not None:
            failure = self.judge_preset(launch, outcome, len(calls), budget_spent=bool(refused), native_logs=native_logs)
        if failure is not None:
            raise failure
        self.record(_harness_end_note(reason, outcome, len(calls), refused, job.max_steps))
        return len(calls)

    def judge_preset(self, launch, outcome: external.ExternalOutcome, calls: int, *,
                     budget_spent: bool = False, native_logs: dict[str, bytes] | None = None) -> InfraFailure | None:
        """Collect the preset's native logs (kept beside the proxy's records), then its verdict: a harness
        that never reached the model, exited with an error or whose own tools failed is infra, not data.
        One the proxy stopped at the step budget used the agent's budget (as one stopped at the wall time
        does): evaluated, however it reported the refused call. `native_logs`: what the harness's script
        printed after it; when None they are read with an exec of their own."""
        files = native_logs if native_logs is not None else preset_rollout.collect_native_logs(
            launch.preset, lambda script, cap: self.exec(script, timeout=60, max_output=cap, reason="collect native logs"))
        self.record(preset_rollout.native_log_step(launch, files))
        if budget_spent:
            return None
        message = preset_rollout.failure(launch, outcome.result, files, calls)
        return InfraFailure(message, reason="harness_failed") if message else None

    def account_external(self, outcome: external.ExternalOutcome, calls: list[dict]) -> None:
        model_ms = sum(call["duration_ms"] or 0.0 for call in calls)
        self.clock.model_ms += model_ms
        self.clock.sandbox_ms += max(0.0, outcome.result.duration_ms - model_ms)

    def evaluate_and_finish(self, steps: int) -> str:
        # Write the queued steps, wait for the proxy's records and tally the run on a thread while the
        # evaluation runs: all bookkeeping. The evaluation's step is the newest, so writing it after costs no
        # renumbering, and it is no action: the tally stays good with it and the finish is one UPDATE.
        settling = _BOOKKEEPING.submit(_closing_connection, self.settle_and_tally)
        try:
            diff, result, started_at = self.evaluate()
        except BaseException:
            futures.wait([settling], PROXY_RECORD_WAIT_S)  # done before the failure path writes its own steps
            raise
        tally = settling.result()
        self.release()  # the sandbox's work is done; its release belongs in the rollout's timings
        task = self.rollout.task
        passed = result.exit_code == task.success_exit_code and not result.timed_out
        reward = 1.0 if passed else 0.0
        status = R.SUCCEEDED if passed else R.FAILED
        # One commit (one WAL flush): the evaluation's step, the trajectory's outcome and the rollout's. Locks
        # are taken in the order trajectory, job, rollout; nothing takes a trajectory's lock after a job's.
        with transaction.atomic():
            self.record(_eval_step(task, result, started_at, passed, reward, self.eval_facts))
            tally = tally and tally.with_steps(self.pending)
            self.flush(relaxed=False)
            trajectory_finish(trajectory_id=self.trajectory_id, status="completed", reward=reward, success=passed,
                              final_diff=diff.stdout if diff.exit_code == 0 else "", tally=tally)
            rollout_services.rollout_finish(
                rollout_id=self.rollout.pk, job_id=self.job.pk, worker=self.worker, status=status, reward=reward,
                steps=steps, eval_output=(result.stdout + result.stderr)[-4000:], eval_timed_out=result.timed_out,
                timings=self.clock.as_dict(), enqueue=self.enqueue,
            )
        return status

    def evaluate(self) -> tuple[ExecResult, ExecResult, datetime]:
        """(the workspace diff, the evaluation's result, when it started). Nothing the policy could have
        changed judges it (workers/eval_integrity.py): in place, its processes are killed first; with the
        template's `fresh-sandbox` mode the evaluation runs in a new sandbox holding only its diff. Either way
        the protected and hidden files come from the Task row."""
        task = self.rollout.task
        diff = self.exec("export GIT_CONFIG_NOSYSTEM=1; git add -A >/dev/null 2>&1; "
                         f"git diff --cached {shlex.quote(self.baseline)}", timeout=30, reason="diff")
        fresh = self.job.fleet.template.eval_mode == EnvironmentTemplate.EvalMode.FRESH_SANDBOX
        self.eval_facts = {"eval_mode": "fresh-sandbox" if fresh else "in-place"}
        refusal = self.move_to_fresh_sandbox(task) if fresh else None
        if refusal is None:
            refusal = self.restore_for_eval(task, kill=not fresh)
        started_at = now()
        if refusal is not None:
            return diff, refusal, started_at
        result = self.exec(eval_integrity.eval_command(task, fresh=fresh), timeout=task.eval_timeout_s,
                           reason="eval", evaluation=True)
        if task.eval_files and self.job.fleet.template.reusable:  # the sandbox goes back to the pool
            self.exec(eval_integrity.remove_hidden_command(task), timeout=30, reason="remove hidden evaluation files")
        return diff, result, started_at

    def move_to_fresh_sandbox(self, task) -> ExecResult | None:
        """Take the final diff (protected paths left out), give the policy's sandbox back, claim a new one
        from the same fleet, set the task up in it and apply the diff. None when the diff applied, else the
        refused evaluation (a diff that does not apply fails the run)."""
        patch = self.exec(eval_integrity.transport_diff_command(task, self.baseline), timeout=60,
                          max_output=EVAL_PATCH_BYTES, reason="diff for the fresh evaluation")
        if patch.exit_code != 0 or patch.truncated_bytes:
            return eval_integrity.refused(
                f"the final diff could not be taken (exit {patch.exit_code}, {patch.truncated_bytes} bytes over "
                f"the {EVAL_PATCH_BYTES}-byte limit): {patch.stderr[-300:]}")
        self.release()  # destroys the policy's sandbox and everything still running in it
        lease = fleet_ops.sandbox_claim(fleet=self.job.fleet, holder=f"rollout:{self.rollout.pk}:eval:{self.worker}")
        self.lease = self.heartbeat.lease = lease
        self.eval_facts["eval_sandbox"] = lease.sandbox.name
        self.record(StepRecord(kind="sandbox_event", started_at=now(), text="evaluation: " + _lease_note(lease),
                               payload={"sandbox": lease.sandbox.name, "cold": lease.sandbox.cold_claim,
                                        "claim_ms": round(lease.claim_ms, 1), "purpose": "eval"}))
        self.prepare_workspace()
        fleet_ops.sandbox_write_files(lease, {eval_integrity.PATCH_PATH: patch.stdout})
        applied = self.exec(eval_integrity.APPLY_PATCH, timeout=120, reason="apply final diff")
        self.eval_facts["patch_bytes"] = len(patch.stdout.encode())
        if applied.exit_code != 0:
            return eval_integrity.refused(f"the final diff does not apply to the task: {applied.stderr[-500:]}")
        return None

    def restore_for_eval(self, task, *, kill: bool) -> ExecResult | None:
        """Kill what the policy left running (in place), scrub the workspace and write the protected and
        hidden files from the Task row. None when done, else the refused evaluation."""
        lease = self.held()
        prepared = self.exec(eval_integrity.prepare_command(task, kill=kill), timeout=60, reason="prepare evaluation")
        self.eval_facts.update(prepare=(prepared.stdout + prepared.stderr)[-500:],
                               prepare_ms=round(prepared.duration_ms, 1))
        if prepared.exit_code != 0:
            return eval_integrity.refused(f"the sandbox could not be made safe to evaluate in "
                                          f"(exit {prepared.exit_code}): {prepared.stderr[-500:]}")
        files = eval_integrity.restored_files(task)
        fleet_ops.sandbox_write_files(lease, files)
        self.eval_facts.update(restored=len(files), hidden=len(task.eval_files))
        return None

    def infra_failure(self, error: SandboxError) -> str:
        """Infrastructure failed, not the model: retry transient errors while attempts remain, else
        infra_error. The attempt's trajectory is kept, marked infra_error (out of training data)."""
        rollout, worker = self.rollout, self.worker
        message = f"{error.reason}: {error}"
        self.finish_trajectory("infra_error", note=message)
        self.release()
        if not error.permanent and rollout.attempt < settings.TROVE_ROLLOUT_MAX_ATTEMPTS:
            if rollout_services.rollout_requeue(rollout_id=rollout.pk, worker=worker, error=message):
                return R.QUEUED
        rollout_services.rollout_finish(rollout_id=rollout.pk, job_id=self.job.pk, worker=worker, status=R.INFRA_ERROR,
                                        error=message[:4000], timings=self.clock.as_dict(), enqueue=self.enqueue)
        return R.INFRA_ERROR

    # --- helpers -----------------------------------------------------------------------------------------

    def held(self) -> fleet_ops.Lease:
        assert self.lease is not None, "no sandbox claimed yet"
        return self.lease

    def exec(self, command: str, *, evaluation: bool = False, **options) -> ExecResult:
        """`fleet_ops.sandbox_exec` under the held lease, its times on the clock (Clock.command)."""
        started = time.perf_counter()
        result = fleet_ops.sandbox_exec(self.held(), command, **options)
        self.clock.command(result, (time.perf_counter() - started) * 1000, evaluation=evaluation)
        return result

    def record(self, step: StepRecord) -> None:
        """Queue a step; the queue is written once its oldest step has waited STEP_FLUSH_S."""
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(step)
        if time.monotonic() - self.pending_since >= STEP_FLUSH_S:
            self.flush()

    def flush(self, *, relaxed: bool = True) -> None:
        """Write the queued steps. Committed asynchronously (no WAL flush wait): the trajectory's finish, a
        normal commit, comes after and makes them durable with it. `relaxed=False` inside the caller's
        transaction, which commits them (no nested transaction: fewer round trips)."""
        if not self.pending:
            return
        steps, self.pending = self.pending, []
        if relaxed:
            with relaxed_commit():
                steps_append(trajectory_id=self.trajectory_id, steps=steps)
        else:
            steps_append(trajectory_id=self.trajectory_id, steps=steps)

    def settle(self) -> None:
        """Write the queued steps, then wait until the proxy's records of the harness's calls are stored."""
        self.flush()
        _wait_for_model_calls(self.trajectory_id, self.model_calls)

    def settle_and_tally(self) -> Tally | None:
        self.settle()
        return trajectory_tally(trajectory_id=self.trajectory_id)

    def finish_trajectory(self, status: str, *, note: str) -> None:
        self.record(StepRecord(kind="note", started_at=now(), text=note, is_error=True))
        self.settle()
        trajectory_finish(trajectory_id=self.trajectory_id, status=status)

    def release(self) -> None:
        """End the lease, once. Counted as sandbox lifecycle time (a single-use sandbox is destroyed here)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        self.heartbeat.lease = None
        started = time.perf_counter()
        try:
            fleet_ops.sandbox_release(lease)
        except SandboxError as error:  # the reconciler reaps what could not be destroyed now
            log.warning("release of %s failed: %s", lease.sandbox.name, error)
        self.clock.sandbox_lifecycle_ms += (time.perf_counter() - started) * 1000


def _seed(rollout: Rollout) -> int:
    return rollout.job_id * 100_003 + rollout.sample_index * 7 + rollout.attempt


def _lease_note(lease: fleet_ops.Lease) -> str:
    kind = "cold (created on demand)" if lease.sandbox.cold_claim else "warm"
    return f"leased {kind} sandbox {lease.sandbox.name} (fencing token {lease.fencing_token})"


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


def _eval_step(task, result: ExecResult, started_at: datetime, passed: bool, reward: float,
               facts: dict) -> StepRecord:
    verdict = "passed" if passed else ("timed out" if result.timed_out else f"failed (exit {result.exit_code})")
    return StepRecord(
        kind="eval", command=task.eval_command, output=result.stdout + result.stderr, exit_code=result.exit_code,
        started_at=started_at, ended_at=now(), duration_ms=result.duration_ms, is_error=result.timed_out,
        text=f"evaluation {verdict}; reward {reward}",
        payload={"reward": reward, "timed_out": result.timed_out, "timeout_s": task.eval_timeout_s, **facts},
    )


def _wait_for_model_calls(trajectory_id: int, expected: int) -> None:
    """The proxy records calls off the request path; give its writer a moment to catch up (on the full
    stack, store what waits in the proxy's stream meanwhile rather than wait for the ingest task)."""
    deadline = time.monotonic() + PROXY_RECORD_WAIT_S
    while expected and Step.objects.filter(trajectory_id=trajectory_id, kind="model_call").count() < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.warning("trajectory %s: proxy recorded fewer than %s model calls in time", trajectory_id, expected)
            return
        _catch_up(remaining)


def _catch_up(remaining: float) -> None:
    """Store what waits in the proxy's stream, or wait one slice for it. A read that found nothing has
    blocked for its slice already (the record may have been stored meanwhile by another consumer, such as
    the catch-up thread, so the caller counts again at once); only a read that came back early (no Redis,
    or Redis unreachable) leaves the rest of the slice to sleep, so the caller's count never spins."""
    slice_s, started = min(INGEST_SLICE_S, max(remaining, 0)), time.monotonic()
    if not ingest_pending_records(slice_s):
        time.sleep(max(0.0, slice_s - (time.monotonic() - started)))


# --- the external harness ------------------------------------------------------------------------------

def _external_base_url(fleet: Fleet) -> str:
    """The proxy's address as seen from inside the fleet's sandboxes. A local sandbox has no network but
    the proxy-only forwarder; elsewhere (Kubernetes, a shared host network) it is the proxy's public URL."""
    network = fleet.template.network
    if network != "none" and (fleet.backend != "local" or network == "allow-list"):
        return settings.TROVE_PROXY_PUBLIC_URL
    if network == "proxy-only" and settings.TROVE_PROXY_SOCKET:
        return f"http://127.0.0.1:{PROXY_PORT}"
    raise SandboxError(
        f"fleet {fleet.name}: an external harness must reach the proxy, but template {fleet.template} has "
        f"network {network!r}" + ("" if settings.TROVE_PROXY_SOCKET else " and TROVE_PROXY_SOCKET is empty")
        + ": use a template with network 'proxy-only'", reason="no_proxy_route", permanent=True)


def _closing_connection(function, *args, **kwargs):
    """Call `function`, then close this thread's database connection (for calls on a short-lived thread)."""
    try:
        return function(*args, **kwargs)
    finally:
        connection.close()


def _kill_quietly(lease: fleet_ops.Lease, script: str) -> None:
    try:
        fleet_ops.sandbox_exec(lease, script, timeout=10, reason="cancel external harness")
    except SandboxError as error:  # taken back (stale fence) or gone: whoever has it destroys it
        log.info("could not kill the harness in %s: %s", lease.sandbox.name, error)


def _settled_model_calls(trajectory_id: int, token: str) -> tuple[list[dict], int]:
    """The trajectory's model calls once all of the harness's calls are stored, and how many calls the
    proxy refused past the job's step budget. The attempt's token is closed first and the proxy's count of
    the calls it admitted read in the same step (admission.py: in Redis, or in this process when the
    embedded proxy runs here), then the store is caught up until it holds that many; when the count is
    unknown (Redis cannot answer, the proxy runs elsewhere without Redis), or when more calls are stored than
    counted (the proxy let calls through uncounted while Redis was down), the count is taken as settled once
    it stopped moving for PROXY_RECORD_QUIET_S."""
    gate = _admitted_calls(token)
    admitted = None if gate is None else gate.admitted
    calls = Step.objects.filter(trajectory_id=trajectory_id, kind="model_call")
    deadline = time.monotonic() + PROXY_RECORD_WAIT_S
    count, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        if admitted is not None:
            # Distinct call ids: the proxy counts by call id, and the store keeps one step per call id.
            stored = calls.exclude(call_id=None).values("call_id").distinct().count()
            if stored == admitted:
                break
            if stored > admitted:  # calls went ahead uncounted (Redis was down for the proxy): wait for quiet
                log.warning("trajectory %s: %s calls stored, %s counted: waiting for quiet", trajectory_id,
                            stored, admitted)
                admitted = None
        if admitted is None:
            current = calls.count()
            if current != count:
                count, quiet_since = current, time.monotonic()
            elif time.monotonic() - quiet_since >= PROXY_RECORD_QUIET_S:
                break
        _catch_up(deadline - time.monotonic())
    else:
        log.warning("trajectory %s: the proxy's records were not all stored within %ss (admitted: %s)",
                    trajectory_id, PROXY_RECORD_WAIT_S, admitted)
    rows = calls.order_by("started_at", "seq")
    return [dict(row) for row in rows.values("call_id", "is_error", "payload", "duration_ms")], (
        gate.refused if gate is not None else 0)


def _admitted_calls(token: str) -> GateCount | None:
    """What the proxy admitted and refused for this attempt, its token closed to more; None when unknown."""
    try:
        return close_and_count_admitted(token)
    except redis.RedisError as exc:
        log.warning("could not read the proxy's count of admitted calls (%s): waiting for quiet", exc)
        return None


def _external_failure(outcome: external.ExternalOutcome, calls: list[dict]) -> InfraFailure | None:
    """Whether the run says nothing about the agent: its last model call failed on the model server's side
    (whatever the harness made of it), or the harness failed without a single call reaching the proxy (it
    could not start, or could not reach the proxy). Either way it must not become training data."""
    if not calls:
        if outcome.result.ok:
            return None
        tail = (outcome.result.stdout + outcome.result.stderr)[-300:]
        return InfraFailure(f"the harness ended ({outcome.reason}) without one model call reaching the proxy; "
                            f"its output ends: {tail}", reason="harness_failed")
    last = calls[-1]
    failure = external.server_failure(is_error=last["is_error"], payload=last["payload"] or {},
                                      call_id=last["call_id"])
    if failure is None:
        return None
    return InfraFailure(failure.message, reason="model_error", permanent=failure.permanent)


def _harness_end_note(reason: str, outcome: external.ExternalOutcome, calls: int, refused: int,
                      max_steps: int) -> StepRecord:
    text = f"harness ended: {reason}"
    if refused:
        text += (f" (the job's step budget of {max_steps} model calls was spent: the proxy refused "
                 f"{refused} more call(s), forwarded none of them; the harness then {outcome.reason})")
    return StepRecord(kind="note", started_at=now(), text=text,
                      payload={"reason": reason, "steps": calls, "exit_code": outcome.result.exit_code,
                               "refused_calls": refused})


def _harness_step(command: str, outcome: external.ExternalOutcome, proxy_url: str, calls: int, *,
                  harness: str = "external", reason: str | None = None) -> StepRecord:
    result, reason = outcome.result, reason or outcome.reason
    step = _command_step(command, result, outcome.started_at, outcome.ended_at)
    step.text = f"{harness} harness: {reason} after {result.duration_ms / 1000:.1f}s, {calls} model call(s)"
    step.payload.update({"harness": harness, "reason": reason, "model_calls": calls,
                         # the token is a credential while the rollout runs: not in the record
                         "base_url": f"{proxy_url}/r/<token>/v1"})
    return step
