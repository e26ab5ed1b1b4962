"""Streaming a job's RL samples: GET /api/v1/jobs/{id}/samples/ and TroveClient.iter_samples."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.records import TrajectoryRecord
from experience.services.ingest import trajectory_ingest
from tests.experience.distill.rl_traffic import TokenServer, agent_run
from tests.webapp.rollouts.jobs_factories import finish, make_job
from trove_client import TroveClient
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import Rollout, RolloutJob

R = Rollout.Status


def trainer_token() -> str:
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["trainer"])
    return Token.objects.create(user=user).key


@pytest.fixture
def api(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {trainer_token()}")
    return client


def compacted(turn, messages):
    return [messages[0], {"role": "user", "content": "Summary of earlier turns."}] if turn == 2 else messages


def finished_job(tokenizer_path, *, infra_error_task: str | None = None) -> tuple[RolloutJob, dict[int, list]]:
    """A job whose rollouts each recorded a run through a token-id server (task "b" compacts its history),
    finished through the real state machine. Returns the job and what the server generated, by rollout."""
    job = make_job(["a", "b"], samples_per_task=2)
    generated = {}
    while rollout := job.rollouts.filter(status=R.QUEUED).select_related("task").order_by("pk").first():
        server = TokenServer(tokenizer_path, policy_version=f"step-{rollout.pk}")
        steps = agent_run(server, 4, edit=compacted if rollout.task.key == "b" else None)
        record = TrajectoryRecord(source="rollout", source_format="trove-rollout", source_ref=f"rollout:{rollout.pk}",
                                  task_key=rollout.task.key, status="completed", started_at=datetime.now(UTC),
                                  steps=steps, metadata={"job_id": job.pk, "sample_index": rollout.sample_index})
        trajectory = trajectory_ingest(record=record, rollout_runner=True)[0]
        Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory)
        status = R.INFRA_ERROR if rollout.task.key == infra_error_task else R.SUCCEEDED
        finish(rollout.pk, status)
        generated[rollout.pk] = server.generated
    job.refresh_from_db()
    return job, generated


def test_a_finished_jobs_samples_page_through_with_their_masks_logprobs_and_forks(api, tokenizer_path):
    job, generated = finished_job(tokenizer_path)
    assert job.status not in ("queued", "running")
    url = f"/api/v1/jobs/{job.pk}/samples/"
    first = api.get(url, {"limit": 1}).json()
    assert first["has_more"] and not first["done"] and first["skipped"] == []
    samples, cursor, pages = list(first["results"]), first["next_cursor"], 1
    while True:
        page = api.get(url, {"after": cursor, "limit": 1}).json()
        samples += page["results"]
        cursor, pages = page["next_cursor"], pages + 1
        if page["done"]:
            break
    assert pages == 4 and cursor == "4"
    by_rollout = {}
    for sample in samples:
        by_rollout.setdefault(sample["rollout_id"], []).append(sample)
    assert set(by_rollout) == set(generated)
    for rollout_id, rollout_samples in by_rollout.items():
        rollout = Rollout.objects.select_related("task").get(pk=rollout_id)
        expected_forks = ["compaction"] if rollout.task.key == "b" else []
        assert [s["fork"]["cause"] for s in rollout_samples if s["fork"]] == expected_forks
        ids = [t for s in rollout_samples for t, m in zip(s["token_ids"], s["loss_mask"], strict=True) if m]
        logprobs = [lp for s in rollout_samples for lp, m in zip(s["logprobs"], s["loss_mask"], strict=True) if m]
        assert ids == [t for call in generated[rollout_id] for t in call["ids"]]
        assert logprobs == [lp for call in generated[rollout_id] for lp in call["logprobs"]]
        assert all(s["exact"] and s["policy_version"] == f"step-{rollout_id}" for s in rollout_samples)
        assert {s["task"] for s in rollout_samples} == {rollout.task.key}
        assert [s["sample"] for s in rollout_samples] == list(range(len(rollout_samples)))


def test_a_trainer_resumes_from_a_cursor_and_sees_only_later_rollouts(api, tokenizer_path):
    job, _ = finished_job(tokenizer_path)
    url = f"/api/v1/jobs/{job.pk}/samples/"
    everything = api.get(url, {"limit": 200}).json()
    resumed = api.get(url, {"after": 2, "limit": 200}).json()
    assert everything["done"] and resumed["done"]
    assert resumed["results"] == [s for s in everything["results"] if int(s["cursor"]) > 2]
    assert {s["cursor"] for s in resumed["results"]} == {"3", "4"}


def test_rollouts_that_are_no_training_data_are_skipped_with_a_reason(api, tokenizer_path):
    job, _ = finished_job(tokenizer_path, infra_error_task="a")
    page = api.get(f"/api/v1/jobs/{job.pk}/samples/", {"limit": 200}).json()
    assert {s["task"] for s in page["results"]} == {"b"}
    assert [s["reason"] for s in page["skipped"]] == ["rollout infra_error"] * 2


@pytest.mark.parametrize(("query", "field"), [({"after": -1}, "after"), ({"limit": 0}, "limit"),
                                              ({"limit": 10_000}, "limit")])
def test_a_bad_cursor_or_limit_is_refused_naming_the_field(api, query, field):
    job = make_job(["a"])
    response = api.get(f"/api/v1/jobs/{job.pk}/samples/", query)
    assert response.status_code == 400 and field in response.json()


def test_the_client_streams_every_sample_of_a_finished_job(live_server, transactional_db, tokenizer_path):
    job, generated = finished_job(tokenizer_path)
    trove = TroveClient(live_server.url, trainer_token(), timeout=10)
    samples = list(trove.iter_samples(job.pk, limit=1, poll_interval=0.05))
    assert {s["rollout_id"] for s in samples} == set(generated)
    assert sum(sum(s["loss_mask"]) for s in samples) == sum(len(c["ids"]) for g in generated.values() for c in g)
    resumed = list(trove.iter_samples(job.pk, after=samples[0]["cursor"], poll_interval=0.05))
    assert resumed == [s for s in samples if int(s["cursor"]) > int(samples[0]["cursor"])]
