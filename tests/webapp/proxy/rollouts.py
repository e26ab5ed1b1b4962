"""Running rollouts for the proxy's database-backed tests: real rows made by the real services, in the
state a rollout runner leaves them while its harness calls the model (running, with a trajectory)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_open
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create, rollout_finish, rollout_start
from workers.seed import seed_demo_task_set, seed_local_fleet

WORKER = "proxy-test-worker"


def running_rollout(*, upstream_v1: str, api_key_ref: str = "") -> Rollout:
    """A running rollout of a new one-rollout job whose model endpoint is `upstream_v1`."""
    fleet = seed_local_fleet(name=f"proxy-{uuid.uuid4().hex[:8]}", min_warm=0, max_warm=1, max_total=1)
    task_set = seed_demo_task_set()
    job = job_create(task_set=task_set, fleet=fleet, model_base_url=upstream_v1, model_name="scripted-ok",
                     task_keys=[task_set.tasks.order_by("key").first().key], api_key_ref=api_key_ref,
                     enqueue=lambda rollout_id: None)
    rollout = rollout_start(rollout_id=job.rollouts.get().pk, worker=WORKER)
    assert rollout is not None
    trajectory = trajectory_open(rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_ref=f"rollout:{rollout.pk}:attempt:1",
        task_key=rollout.task.key, status="running", started_at=datetime.now(UTC)))
    Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory)
    rollout.refresh_from_db()
    return rollout


def finish(rollout: Rollout, status: str = Rollout.Status.SUCCEEDED) -> None:
    assert rollout_finish(rollout_id=rollout.pk, worker=WORKER, status=status)
