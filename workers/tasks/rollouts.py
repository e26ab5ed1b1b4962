"""Rollout tasks. `run` is idempotent (claims the rollout with a conditional update), so it may be
redelivered: acks_late means a worker killed mid-rollout leaves the message for another worker, which
finds the rollout running with a stale heartbeat once the reaper has taken it back.

A rollout is sent only when its job has a slot for it (its concurrency); one whose start finds the job
full anyway is deferred and its message dropped: the rollout waits, queued, until a finish frees a slot and
sends it (webapp/rollouts/services.py). So `run` never re-enqueues a deferred rollout itself.

A message the broker lost (Redis restarted without its data, a queue purged) would leave its rollout
queued forever: the reaper also sends again the queued rollouts of open jobs whose message went out more
than TROVE_ROLLOUT_RESEND_S ago, once the broker's queue is empty (while it is not, the workers are still
working through it and the rollout may simply be waiting its turn). A message that was not lost after all
becomes a duplicate, which finds the rollout no longer queued and does nothing.

Hand-off: the finish that frees a slot sends the job's next waiting rollout. Through the broker that costs a
message's round trip, the ack and the next task's start, on every rollout while the job's slots are full. So a
finishing task keeps one of the rollouts its finish sends and runs it itself, straight after (Handoff), while
no other message waits in a queue its worker consumes (another job's rollout, a periodic task: those keep
their turn) and for at most HANDOFF_WINDOW_S from the task's start (a task's time limits, and a warm
shutdown waits for it, which stops the hand-offs). The kept rollout was marked sent in the finish's
transaction like any other; a worker dying before it starts it leaves it queued and sent, and the reaper
sends it again after TROVE_ROLLOUT_RESEND_S, exactly like a message the broker lost. TROVE_ROLLOUT_HANDOFF=0
turns it off (every start then comes from a message)."""

from __future__ import annotations

import time

from celery import shared_task
from celery.worker import state as worker_state
from django.conf import settings
from kombu.exceptions import ChannelError

from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout
from workers import fleet_ops
from workers.identity import execution_id
from workers.rollout_runner import rollout_run
from workers.sandboxes.base import SandboxError

REQUEUE_COUNTDOWN_S = 2
# How long one task goes on running the rollouts it hands itself; the next one after goes through the broker.
# Well inside the task's soft time limit (CELERY_TASK_SOFT_TIME_LIMIT) with a job's whole wall time on top.
HANDOFF_WINDOW_S = 300.0


@shared_task(name="trove.rollouts.run", acks_late=True, ignore_result=True)
def run_rollout(rollout_id: int) -> str | None:
    handoff = Handoff(consumed_queues())
    next_id: int | None = rollout_id
    status = None
    try:
        while next_id is not None:
            status = run_one(next_id, handoff.enqueue)
            next_id = handoff.take()
    finally:
        handoff.release()  # raised before running the kept rollout: it goes through the broker
    return status


def run_one(rollout_id: int, enqueue) -> str | None:
    status = rollout_run(rollout_id=rollout_id, worker=execution_id("rollout"), enqueue=enqueue)
    if status == Rollout.Status.QUEUED:
        run_rollout.apply_async((rollout_id,), countdown=REQUEUE_COUNTDOWN_S)
    return status


def enqueue_rollout(rollout_id: int) -> None:
    run_rollout.delay(rollout_id)


class Handoff:
    """The `enqueue` of a running task's finishes: keeps the first rollout sent for this task to run next
    (module docstring) and sends the others, and that one too when it may not be kept, to the broker."""

    def __init__(self, queues: list[str]) -> None:
        self.queues = queues
        self.started = time.monotonic()
        self.kept: int | None = None

    def enqueue(self, rollout_id: int) -> None:
        if self.kept is None and self.may_keep():
            self.kept = rollout_id
        else:
            enqueue_rollout(rollout_id)

    def may_keep(self) -> bool:
        if not settings.TROVE_ROLLOUT_HANDOFF:
            return False
        if _set(worker_state.should_stop) or _set(worker_state.should_terminate):
            return False  # shutting down: the next rollout goes to a worker that stays
        if time.monotonic() - self.started >= HANDOFF_WINDOW_S:
            return False
        return queues_backlog(self.queues) == 0

    def take(self) -> int | None:
        kept, self.kept = self.kept, None
        return kept

    def release(self) -> None:
        if (kept := self.take()) is not None:
            enqueue_rollout(kept)


def _set(flag) -> bool:
    # Celery's own test (celery.worker.state.maybe_shutdown): a warm shutdown sets the exit code, often 0.
    return flag is not None and flag is not False


def consumed_queues() -> list[str]:
    """The queues this worker takes messages from: its -Q, else every configured queue (the rollouts' and
    the periodic tasks', settings.CELERY_TASK_QUEUES)."""
    app = run_rollout.app
    return sorted(app.amqp.queues.consume_from or [app.conf.task_default_queue])


@shared_task(name="trove.rollouts.reap_stale", ignore_result=True)
def reap_stale_rollouts() -> dict:
    """Take back rollouts whose worker died: requeue (and re-enqueue) or mark infra_error; reap sandboxes.
    Then send again the queued rollouts whose message was lost (module docstring)."""
    outcome = {"requeued": 0, "infra_error": 0, "resent": resend_lost_rollouts()}
    for rollout in rollout_services.rollouts_stale():
        sandbox = rollout.sandbox
        status = rollout_services.rollout_reap(rollout=rollout)
        if status == Rollout.Status.QUEUED:
            outcome["requeued"] += 1
            enqueue_rollout(rollout.pk)
        elif status == Rollout.Status.INFRA_ERROR:
            outcome["infra_error"] += 1
        if sandbox is not None and status != Rollout.Status.RUNNING:
            try:
                fleet_ops.sandbox_terminate(sandbox=sandbox, reason=f"rollout {rollout.pk}'s worker died")
            except SandboxError:
                pass  # the reconciler finds it by label
    return outcome


def resend_lost_rollouts() -> int:
    """Send the queued rollouts that lack a message: again for those whose message may have been lost, and
    for the first time for those waiting for a slot their job now has (its concurrency was raised). Returns
    how many were sent."""
    sent = rollout_services.jobs_dispatch_waiting(enqueue=enqueue_rollout)
    if broker_backlog() > 0:
        return sent
    ids = rollout_services.rollouts_resend_due()
    for rollout_id in ids:
        enqueue_rollout(rollout_id)
    return sent + len(ids)


def broker_backlog() -> int:
    """Messages waiting in the rollouts' broker queue (not counting those a worker has already taken)."""
    return queues_backlog([run_rollout.app.conf.task_default_queue])


def queues_backlog(queues: list[str]) -> int:
    """Messages waiting in these broker queues, on a connection of the app's pool (no connect per look)."""
    with run_rollout.app.pool.acquire(block=True) as connection:
        return sum(_queue_size(connection.default_channel, queue) for queue in queues)


def _queue_size(channel, queue: str) -> int:
    try:
        return channel.queue_declare(queue=queue, passive=True).message_count
    except ChannelError:  # no such queue: Redis drops an empty list
        return 0
