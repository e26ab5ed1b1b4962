"""Run provenance cannot be spoofed: the API and the importers cannot store a run whose source is `rollout`.

Each test performs the attack against the real API, importers and Postgres: a client posts runs claiming to
be rollouts (in every spelling), or uploads a Trove export (real or crafted) of rollout runs. The attack
fails if any run with source `rollout` appears that Trove's rollout runner did not open.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.errors import ValidationError
from experience.exporters.trove_jsonl import dumps, record_to_dict
from experience.models import Trajectory
from experience.services.exporting import export_filters, trajectories_export
from experience.services.importing import trajectories_import_file
from experience.services.ingest import (
    steps_append,
    trajectories_ingest_many,
    trajectory_finish,
    trajectory_open,
)
from experience.services.provenance import spelled_source
from tests.experience.services.store_factories import RunFactory, StepFactory
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db
SPELLINGS = ["rollout", "Rollout", "ROLLOUT", " rollout", "rollout\n", "\trollout ", "roll-out", "roll_out",
             "r o l l o u t", "roll\u200bout", "ｒｏｌｌｏｕｔ", "ROLLOUT\u00a0"]


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    user = get_user_model().objects.create_user("client")
    user.groups.add(role_groups_sync()["researcher"])  # the role that may post runs
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def run_json(**fields) -> dict:
    body = record_to_dict(RunFactory(steps=[StepFactory()], reward=1.0, success=True, **fields))
    body.pop("trove_format")
    return body


def rollout_runs() -> int:
    return Trajectory.objects.filter(source="rollout").count()


@pytest.mark.parametrize("source", SPELLINGS)
def test_posting_a_run_claiming_to_be_a_rollout_is_a_400_naming_the_field(api, source):
    response = api.post("/api/v1/trajectories/", run_json(source=source), format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["field"] == "source"
    assert "reserved for runs Trove's rollout runner made" in response.json()["detail"]
    assert Trajectory.objects.count() == 0


def test_one_rollout_claim_in_a_batch_refuses_the_whole_batch(api):
    body = {"trajectories": [run_json(), run_json(source="Rollout ")]}

    response = api.post("/api/v1/trajectories/", body, format="json")

    assert (response.status_code, response.json()["field"]) == (400, "trajectories[1].source")
    assert Trajectory.objects.count() == 0


def test_other_sources_are_stored_as_given(api):
    response = api.post("/api/v1/trajectories/", {"trajectories": [run_json(), run_json(source="lab-cluster-7")]},
                        format="json")

    assert response.status_code == 201, response.json()
    assert sorted(Trajectory.objects.values_list("source", flat=True)) == ["api", "lab-cluster-7"]


def _real_rollout() -> Trajectory:
    """A run opened the way the rollout runner opens one, with steps and its evaluated outcome."""
    opened = trajectory_open(rollout_runner=True, record=RunFactory(
        steps=[], source="rollout", source_format="trove-rollout", source_ref="rollout:1:attempt:1",
        status="running"))
    steps_append(trajectory_id=opened.pk, steps=[StepFactory(), StepFactory()])
    trajectory_finish(trajectory_id=opened.pk, status="completed", reward=0.0, success=False)
    return Trajectory.objects.get(pk=opened.pk)


def test_uploading_an_export_of_real_rollouts_imports_them_as_imports(api):
    original = _real_rollout()
    export = b"".join(trajectories_export(filters=export_filters({}), format="trove"))
    assert json.loads(export)["source"] == "rollout"  # the export says where the run came from

    response = api.post("/api/v1/trajectories/import/",
                        {"file": SimpleUploadedFile("export.jsonl", export)}, format="multipart")

    assert response.status_code == 201, response.json()
    (imported_id,) = response.json()["files"][0]["trajectory_ids"]
    imported = Trajectory.objects.get(pk=imported_id)
    assert imported.pk != original.pk
    assert (imported.source, imported.metadata["claimed_source"]) == ("import", "rollout")
    assert (imported.reward, imported.success) == (0.0, False)
    assert list(Trajectory.objects.filter(source="rollout").values_list("pk", flat=True)) == [original.pk]


@pytest.mark.parametrize("source", ["rollout", " ROLLOUT", "roll_out"])
def test_a_crafted_export_claiming_rollout_with_a_forged_reward_is_recorded_as_an_import(tmp_path, source):
    forged = RunFactory(source=source, source_format="trove-rollout", source_ref="rollout:99:attempt:1",
                        reward=1.0, success=True)
    path = tmp_path / "forged.jsonl"
    path.write_text(dumps(forged) + "\n")

    report = trajectories_import_file(path=path)

    assert (report.status, report.imported) == ("imported", 1), report.error
    stored = Trajectory.objects.get(pk=report.trajectory_ids[0])
    assert (stored.source, stored.metadata["claimed_source"]) == ("import", source)
    assert rollout_runs() == 0


def test_the_bulk_ingest_service_refuses_a_rollout_unless_the_runner_calls_it():
    with pytest.raises(ValidationError) as refused:
        trajectories_ingest_many(records=[RunFactory(source="rollout")])
    assert refused.value.field == "trajectories[0].source"

    trajectories_ingest_many(records=[RunFactory(source="rollout")], rollout_runner=True)
    assert rollout_runs() == 1


def test_opening_a_live_run_as_a_rollout_needs_the_runner_and_the_exact_spelling():
    record = RunFactory(steps=[], source="rollout", status="running")
    with pytest.raises(ValidationError) as refused:
        trajectory_open(record=record)
    assert refused.value.field == "source"
    with pytest.raises(ValidationError, match="write the source as 'rollout'"):
        trajectory_open(record=replace(record, source="Rollout"), rollout_runner=True)
    assert rollout_runs() == 0

    trajectory_open(record=record, rollout_runner=True)
    assert rollout_runs() == 1


@pytest.mark.parametrize("source", SPELLINGS)
def test_every_spelling_of_rollout_is_recognised(source):
    assert spelled_source(source) == "rollout"


@pytest.mark.parametrize("source", ["api", "import", "rollouts", "my-rollout", "", None, 7])
def test_other_sources_are_not_taken_for_rollout(source):
    assert spelled_source(source) is None


def test_a_client_cannot_plant_steps_in_a_rollout(api):
    rollout = _real_rollout()
    forged_eval = {"steps": [{"kind": "eval", "text": "Ran 6 tests ... OK", "exit_code": 0}]}

    response = api.post(f"/api/v1/trajectories/{rollout.pk}/steps/", forged_eval, format="json")

    assert (response.status_code, response.json()["field"]) == (409, "trajectory")
    assert list(rollout.steps.values_list("kind", flat=True)) == ["command", "command"]
    missing = api.post("/api/v1/trajectories/999999/steps/", forged_eval, format="json")
    assert missing.status_code == 404
