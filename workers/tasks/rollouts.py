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
becomes a duplicate, which finds the rollout no longer queued and does nothing."""

from __future__ import annotations

from celery import shared_task
from kombu.exceptions import ChannelError

from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout
from workers import fleet_ops
from workers.identity import execution_id
from workers.rollout_runner import rollout_run
from workers.sandboxes.base import SandboxError

REQUEUE_COUNTDOWN_S = 2


@shared_task(name="trove.rollouts.run", acks_late=True, ignore_result=True)
def run_rollout(rollout_id: int) -> str | None:
    status = rollout_run(rollout_id=rollout_id, worker=execution_id("rollout"))
    if status == Rollout.Status.QUEUED:
        run_rollout.apply_async((rollout_id,), countdown=REQUEUE_COUNTDOWN_S)
    return status


def enqueue_rollout(rollout_id: int) -> None:
    run_rollout.delay(rollout_id)


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
    app = run_rollout.app
    with app.connection_for_read() as connection:
        try:
            return connection.default_channel.queue_declare(queue=app.conf.task_default_queue, passive=True).message_count
        except ChannelError:  # no such queue: Redis drops an empty list
            return 0
