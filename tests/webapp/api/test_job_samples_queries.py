"""GET /api/v1/jobs/{id}/samples/ costs the same number of queries whatever the page holds (no N+1 per
rollout or per call), for exact runs and for re-tokenised ones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_ingest
from tests.experience.distill.rl_traffic import TokenServer, agent_run
from tests.webapp.api.test_job_samples_api import api  # noqa: F401 - the trainer's client fixture
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout

R = Rollout.Status


def finished_job(tokenizer_path, tasks: list[str], *, with_ids: bool, turns: int):
    job = make_job(tasks, samples_per_task=2)
    for rollout in job.rollouts.select_related("task").order_by("pk"):
        steps = agent_run(TokenServer(tokenizer_path), turns, with_ids=with_ids)
        record = TrajectoryRecord(source="rollout", source_format="trove-rollout", source_ref=f"rollout:{rollout.pk}",
                                  task_key=rollout.task.key, status="completed", started_at=datetime.now(UTC),
                                  steps=steps, metadata={"job_id": job.pk, "sample_index": rollout.sample_index,
                                                         "model_endpoint": "lab-vllm"})
        Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory_ingest(record=record, rollout_runner=True)[0])
        finish(rollout.pk, R.SUCCEEDED)
    return job


def page_queries(client, job) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/api/v1/jobs/{job.pk}/samples/", {"limit": 200}).json()
    assert page["done"] and not page["skipped"]
    return len(page["results"]), len(queries)


@pytest.mark.parametrize("with_ids", [True, False], ids=["exact", "retokenised"])
def test_a_page_of_many_rollouts_and_calls_costs_what_a_small_one_does(api, tokenizer_path, settings, with_ids):  # noqa: F811
    settings.TROVE_RL_TOKENIZERS = {"lab-vllm": str(tokenizer_path)}
    small = finished_job(tokenizer_path, ["a"], with_ids=with_ids, turns=2)
    large = finished_job(tokenizer_path, ["b", "c", "d", "e"], with_ids=with_ids, turns=6)

    small_samples, small_queries = page_queries(api, small)
    large_samples, large_queries = page_queries(api, large)

    assert (small_samples, large_samples) == (2, 8)
    assert large_queries == small_queries, f"{small_queries} queries for 2 rollouts, {large_queries} for 8"
    # the token, the job, its page of rollouts, their calls' payloads; re-tokenised runs also read their
    # endpoints, steps and context blobs
    assert small_queries == (4 if with_ids else 7)
