"""A tokenizer named for an endpoint (TROVE_RL_TOKENIZERS) that cannot be loaded: the samples API and the `rl`
dataset build say which endpoint, which file and why, instead of a bare "No such file or directory"."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.records import TrajectoryRecord
from experience.services import datasets
from experience.services.ingest import trajectory_ingest
from tests.experience.distill.rl_traffic import TokenServer, agent_run
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import Rollout

MISSING = "/nonexistent/trove-test/tokenizer.json"


@pytest.fixture
def api(db):
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["trainer"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture(autouse=True)
def missing_tokenizer(settings, tmp_path):
    settings.TROVE_RL_TOKENIZERS = {"lab-vllm": MISSING}
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def job_without_token_ids(tokenizer_path):
    """A finished job whose one run was recorded without token ids, through endpoint `lab-vllm`."""
    job = make_job(["a"], samples_per_task=1)
    rollout = job.rollouts.get()
    record = TrajectoryRecord(source="rollout", source_format="trove-rollout", source_ref=f"rollout:{rollout.pk}",
                              task_key="a", task_set="rl-set", status="completed", started_at=datetime.now(UTC),
                              reward=1.0, success=True, steps=agent_run(TokenServer(tokenizer_path), 3, with_ids=False),
                              metadata={"job_id": job.pk, "sample_index": 0, "model_endpoint": "lab-vllm"})
    Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory_ingest(record=record, rollout_runner=True)[0])
    finish(rollout.pk, Rollout.Status.SUCCEEDED)
    return job


def test_the_samples_api_says_which_endpoints_tokenizer_cannot_be_loaded(api, tokenizer_path):
    job = job_without_token_ids(tokenizer_path)

    response = api.get(f"/api/v1/jobs/{job.pk}/samples/")

    assert response.status_code == 503, response.content[:300]
    message = str(response.json())
    assert "TROVE_RL_TOKENIZERS" in message and "'lab-vllm'" in message and MISSING in message


def test_an_rl_build_fails_naming_the_endpoint_and_the_file_not_as_an_internal_error(db, tokenizer_path):
    job_without_token_ids(tokenizer_path)
    dataset = datasets.dataset_create(name="rl-set", kind="rl", options={})

    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)

    assert version.status == "failed"
    assert version.error.startswith("TROVE_RL_TOKENIZERS: the tokenizer for endpoint 'lab-vllm' cannot be loaded")
    assert MISSING in version.error


def test_the_run_and_job_pages_still_show_and_say_why_their_runs_give_no_samples(db, tokenizer_path):
    from django.test import Client

    job = job_without_token_ids(tokenizer_path)
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client = Client()
    client.force_login(user)
    run_page = client.get(f"/trajectories/{job.rollouts.get().trajectory_id}/")
    job_page = client.get(f"/jobs/{job.pk}/")

    for page in (run_page, job_page):
        assert page.status_code == 200
        html = page.content.decode()
        assert "the tokenizer for endpoint &#x27;lab-vllm&#x27; cannot be loaded from " + MISSING in html
