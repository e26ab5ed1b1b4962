"""Running rollouts for the proxy's database-backed tests: real rows made by the real services, in the
state a rollout runner leaves them while its harness calls the model (running, with a trajectory, and a
token whose hash is stored: `rollout.proxy_token` is the plaintext the harness would be given)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from experience.models import Step
from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_open
from tests.webapp.rollouts.jobs_factories import make_endpoint
from webapp.proxy.server import ProxyServer
from webapp.rollouts.models import ModelEndpoint, Rollout, new_rollout_token
from webapp.rollouts.services import job_create, rollout_finish, rollout_start
from workers.seed import seed_demo_task_set, seed_local_fleet

WORKER = "proxy-test-worker"


def running_rollout(*, upstream_v1: str = "", key_ref: str = "", endpoint: ModelEndpoint | None = None,
                    **job_options) -> Rollout:
    """A running rollout of a new one-rollout job whose model endpoint is `endpoint`, or a new one at
    `upstream_v1` (registered with loopback allowed: the scripted upstreams listen there). `job_options`
    go to the job (harness, max_steps, ...)."""
    endpoint = endpoint or make_endpoint(upstream_v1, model_names=["scripted-ok"], key_ref=key_ref)
    fleet = seed_local_fleet(name=f"proxy-{uuid.uuid4().hex[:8]}", min_warm=0, max_warm=1, max_total=1)
    task_set = seed_demo_task_set()
    job = job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, model_name="scripted-ok",
                     task_keys=[task_set.tasks.order_by("key").first().key], enqueue=lambda rollout_id: None,
                     **job_options)
    rollout = rollout_start(rollout_id=job.rollouts.get().pk, worker=WORKER)
    assert rollout is not None
    trajectory = trajectory_open(rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", source_ref=f"rollout:{rollout.pk}:attempt:1",
        task_key=rollout.task.key, status="running", started_at=datetime.now(UTC)))
    token, token_hash = new_rollout_token()
    Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory, token=token_hash)
    rollout.refresh_from_db()
    rollout.proxy_token = token  # type: ignore[attr-defined]
    return rollout


def finish(rollout: Rollout, status: str = Rollout.Status.SUCCEEDED) -> None:
    assert rollout_finish(rollout_id=rollout.pk, worker=WORKER, status=status)


def chat_url(server: ProxyServer, token: str) -> str:
    """The Chat Completions URL a harness holding `token` calls on `server`."""
    return f"{server.base_url}/r/{token}/v1/chat/completions"


def stored_call_ids(rollout: Rollout) -> list[str]:
    """The call ids of the rollout's stored model calls, in order."""
    return list(Step.objects.filter(trajectory_id=rollout.trajectory_id, kind="model_call")
                .order_by("seq").values_list("call_id", flat=True))
