"""The trajectories API with a token: search, detail and step pages, bulk ingest, append, import, export, curate."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.exporters.trove_jsonl import record_to_dict
from experience.importers import read_all
from experience.models import Blob, CurationEvent, Step, Trajectory
from experience.services.importing import trajectories_import_file
from tests.experience.importers.fixture_files import EVAL_ZIP, MULTI_SWE, PYDICOM
from tests.experience.services.store_factories import RunFactory, StepFactory, run_record, stored
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    client.user = user
    return client


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["researcher"])  # the role that posts and imports runs
    return client_for(user)


@pytest.fixture
def curator_api():
    user = get_user_model().objects.create_user("curator")
    user.groups.add(role_groups_sync()["curator"])
    return client_for(user)


def as_json(record) -> dict:
    body = record_to_dict(record)
    body.pop("trove_format")
    return body


def counts() -> tuple[int, int, int]:
    return Trajectory.objects.count(), Step.objects.count(), Blob.objects.count()


# --- search ---------------------------------------------------------------------------------------------------


def test_search_filters_and_pages_with_a_cursor_in_fixed_queries(api, django_assert_num_queries):
    ids = stored(*[run_record(model="m-1", calls=1) for _ in range(5)], run_record(model="m-2", calls=1))

    with django_assert_num_queries(2):  # the token, the page
        first = api.get("/api/v1/trajectories/", {"model": "m-1", "limit": 3})
    second = api.get(first.json()["next"])

    assert first.status_code == 200, first.json()
    got = [row["id"] for row in first.json()["results"] + second.json()["results"]]
    assert got == sorted(ids[:5], reverse=True)
    assert second.json()["next"] is None
    row = first.json()["results"][0]
    assert (row["model"], row["n_steps"], row["curation_status"]) == ("m-1", 2, "pending")
    assert row["url"].endswith(f"/api/v1/trajectories/{row['id']}/")


def test_search_finds_a_command_string_in_step_content(api):
    hit, _ = stored(run_record(commands=["pytest tests/test_models.py -k slow"]), run_record(commands=["ls -la"]))

    response = api.get("/api/v1/trajectories/", {"q": "pytest tests/test_models.py -k slow"})

    assert [row["id"] for row in response.json()["results"]] == [hit]


def test_a_bad_filter_is_a_400_naming_it(api):
    response = api.get("/api/v1/trajectories/", {"outcome": "maybe"})

    assert response.status_code == 400
    assert response.json()["field"] == "outcome"


def test_search_filters_by_step_label_and_by_cluster_outcomes_as_the_explorer_does(api):
    from experience.services.step_labels import step_label_add

    labelled, plain = stored(run_record(calls=2), run_record(calls=2))
    step_label_add(trajectory_id=labelled, seq=1, name="reward-hack", actor=api.user)

    found = api.get("/api/v1/trajectories/", {"step_label": "reward-hack"})
    unclustered = api.get("/api/v1/trajectories/", {"cluster_outcomes": "same"})
    bad = api.get("/api/v1/trajectories/", {"cluster_outcomes": "some"})

    assert [row["id"] for row in found.json()["results"]] == [labelled] != [plain]
    assert unclustered.json()["results"] == []  # neither run is in a dedup cluster
    assert bad.status_code == 400 and bad.json()["field"] == "cluster_outcomes"


def test_search_needs_authentication():
    assert APIClient().get("/api/v1/trajectories/").status_code in (401, 403)


# --- detail and steps -----------------------------------------------------------------------------------------


def test_detail_has_the_first_steps_and_a_link_to_the_rest(api, django_assert_num_queries):
    run = run_record(calls=3)
    run.steps[1].output = "long output " * 500  # stored as a blob
    (pk,) = stored(run)

    with django_assert_num_queries(4):  # token, trajectory, steps, blobs
        response = api.get(f"/api/v1/trajectories/{pk}/", {"limit": 4})
    rest = api.get(response.json()["steps_next"])

    body = response.json()
    assert [s["seq"] for s in body["steps"]] == [0, 1, 2, 3]
    assert body["steps"][1]["command"] == "python -m pytest tests/test_mod.py::test_0"
    assert body["steps"][1]["output"] == "long output " * 500
    assert body["steps"][0]["request_messages"] is None and body["steps"][0]["n_request_messages"] == 2
    assert [s["seq"] for s in rest.json()["results"]] == [4, 5] and rest.json()["next"] is None


def test_steps_after_a_seq_with_the_context_the_model_saw(api):
    (pk,) = stored(run_record(calls=2))

    response = api.get(f"/api/v1/trajectories/{pk}/steps/", {"after": 1, "context": 1})

    steps = response.json()["results"]
    assert [s["seq"] for s in steps] == [2, 3]
    assert [m["role"] for m in steps[0]["request_messages"]] == ["system", "user", "assistant", "tool"]


def test_a_missing_trajectory_is_a_404(api):
    assert api.get("/api/v1/trajectories/999999/").status_code == 404


# --- ingest ---------------------------------------------------------------------------------------------------


def test_bulk_ingest_stores_runs_and_a_repeat_adds_nothing(api):
    body = {"trajectories": [as_json(run_record(calls=2)), as_json(run_record(calls=1))]}

    first = api.post("/api/v1/trajectories/", body, format="json")
    before = counts()
    again = api.post("/api/v1/trajectories/", body, format="json")

    assert first.status_code == 201, first.json()
    assert [r["created"] for r in first.json()["results"]] == [True, True]
    assert again.status_code == 200 and [r["created"] for r in again.json()["results"]] == [False, False]
    assert counts() == before and before[0] == 2


def test_a_single_run_may_be_posted_with_defaults_for_what_it_leaves_out(api):
    response = api.post("/api/v1/trajectories/", {
        "source_ref": "my-run-1", "task_key": "t", "status": "completed",
        "steps": [{"kind": "command", "command": "ls", "output": "a\n", "exit_code": 0,
                   "started_at": "2025-01-01T00:00:00+00:00"}],
    }, format="json")

    assert response.status_code == 201, response.json()
    trajectory = Trajectory.objects.get()
    assert (trajectory.source, trajectory.source_ref, trajectory.n_steps) == ("api", "my-run-1", 1)


@pytest.mark.parametrize(("change", "status", "field"), [
    (lambda runs: runs[1]["steps"][1].update(kind="telepathy"), 400, "trajectories[1].steps[1].kind"),
    (lambda runs: runs[1]["steps"][0].update(tokens_in="many"), 400, "trajectories[1].steps[0].tokens_in"),
    (lambda runs: runs[0]["steps"][0].update(colour="red"), 400, "trajectories[0].steps[0].colour"),
    (lambda runs: runs[1].update(started_at="yesterday"), 400, "trajectories[1].started_at"),
    (lambda runs: runs[0].update(task_key=""), 400, "trajectories[0].task_key"),
    (lambda runs: runs[1]["steps"][0].update(output="x" * 101), 413, "trajectories[1].steps[0].output"),
])
def test_a_malformed_batch_is_a_4xx_naming_the_field_and_writes_nothing(api, settings, change, status, field):
    settings.TROVE_MAX_CONTENT_CHARS = 100
    runs = [as_json(run_record(calls=1)), as_json(RunFactory(steps=[StepFactory(), StepFactory()]))]
    change(runs)

    response = api.post("/api/v1/trajectories/", {"trajectories": runs}, format="json")

    assert response.status_code == status, response.json()
    assert response.json()["field"] == field
    assert counts() == (0, 0, 0)


def test_too_many_steps_or_too_big_a_body_is_a_413(api, settings):
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = 2
    too_many = api.post("/api/v1/trajectories/", {"trajectories": [as_json(run_record(calls=2))]}, format="json")
    settings.TROVE_MAX_BODY_BYTES = 1000
    too_big = api.post("/api/v1/trajectories/", {"trajectories": [as_json(run_record(calls=1))]}, format="json")

    assert (too_many.status_code, too_many.json()["field"]) == (413, "trajectories[0].steps")
    assert (too_big.status_code, too_big.json()["field"]) == (413, "body")
    assert counts() == (0, 0, 0)


def test_appending_numbered_steps_twice_adds_them_once(api):
    (pk,) = stored(RunFactory(steps=[]))
    body = {"first_seq": 0, "steps": [{"kind": "command", "command": "ls"}, {"kind": "command", "command": "pwd"}]}

    first = api.post(f"/api/v1/trajectories/{pk}/steps/", body, format="json")
    again = api.post(f"/api/v1/trajectories/{pk}/steps/", body, format="json")

    assert (first.status_code, again.status_code) == (201, 200)
    assert list(Step.objects.filter(trajectory_id=pk).values_list("seq", "kind")) == [(0, "command"), (1, "command")]


# --- import and export ----------------------------------------------------------------------------------------


def test_uploading_files_imports_them_and_reports_each(api):
    with open(PYDICOM, "rb") as traj, open(EVAL_ZIP, "rb") as archive:
        response = api.post("/api/v1/trajectories/import/", {"file": [traj, archive]}, format="multipart")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["imported"], body["files_imported"]) == (1 + 4, 2)
    assert [f["path"] for f in body["files"]] == [PYDICOM.name, EVAL_ZIP.name]
    assert Trajectory.objects.count() == 5
    assert set(Trajectory.objects.values_list("source_format", flat=True)) == {"swe-agent-traj", "inspect-eval"}


def test_uploading_the_same_file_again_adds_nothing(api):
    with open(MULTI_SWE, "rb") as handle:
        api.post("/api/v1/trajectories/import/", {"file": handle}, format="multipart")
    with open(MULTI_SWE, "rb") as handle:
        again = api.post("/api/v1/trajectories/import/", {"file": handle}, format="multipart")

    assert again.status_code == 200
    assert (again.json()["imported"], again.json()["present"]) == (0, 3)
    assert Trajectory.objects.count() == 3


def test_uploading_a_truncated_file_is_a_400_and_writes_nothing(api, tmp_path):
    cut = tmp_path / "output.jsonl"
    cut.write_bytes(MULTI_SWE.read_bytes()[:-500])
    with open(cut, "rb") as handle:
        response = api.post("/api/v1/trajectories/import/", {"file": handle}, format="multipart")

    assert response.status_code == 400
    assert response.json()["field"] == "file" and "output.jsonl line 3" in response.json()["detail"]
    assert counts() == (0, 0, 0)


def test_export_streams_the_selection_as_jsonl(api):
    trajectories_import_file(path=MULTI_SWE)
    trajectories_import_file(path=PYDICOM)

    response = api.get("/api/v1/trajectories/export/", {"format": "trove", "harness": "swe-agent"})

    assert response.status_code == 200 and response.streaming
    assert response["Content-Disposition"] == 'attachment; filename="trajectories.trove.jsonl"'
    lines = b"".join(response.streaming_content).splitlines()
    assert [json.loads(line)["source_ref"] for line in lines] == [r.source_ref for r in read_all(PYDICOM)]


def test_export_as_atif_and_a_bad_format_is_a_400(api):
    stored(run_record(calls=1))

    atif = api.get("/api/v1/trajectories/export/", {"format": "atif"})
    bad = api.get("/api/v1/trajectories/export/", {"format": "csv"})

    assert json.loads(b"".join(atif.streaming_content))["schema_version"].startswith("ATIF-")
    assert (bad.status_code, bad.json()["field"]) == (400, "format")


# --- curation -------------------------------------------------------------------------------------------------


def test_curating_by_filter_records_an_event_per_run(curator_api):
    a, b, c = stored(run_record(model="m-1"), run_record(model="m-1"), run_record(model="m-2"))

    response = curator_api.post("/api/v1/trajectories/curate/", {
        "filter": {"model": "m-1"}, "action": "tag", "tags": ["gold"], "reason": "clean fixes"}, format="json")

    assert response.json() == {"action": "tag", "matched": 2, "changed": 2}
    assert dict(Trajectory.objects.values_list("pk", "tags")) == {a: ["gold"], b: ["gold"], c: []}
    events = CurationEvent.objects.all()
    assert {(e.trajectory_id, e.actor.username, e.reason) for e in events} == {
        (a, "curator", "clean fixes"), (b, "curator", "clean fixes")}


def test_curating_by_ids_and_the_errors(curator_api, api):
    a, b = stored(RunFactory(), RunFactory())

    approved = curator_api.post("/api/v1/trajectories/curate/", {"ids": [a], "action": "approve"}, format="json")
    both = curator_api.post("/api/v1/trajectories/curate/", {"ids": [a], "filter": {"model": "x"},
                                                             "action": "approve"}, format="json")
    empty = curator_api.post("/api/v1/trajectories/curate/", {"filter": {}, "action": "approve"}, format="json")
    untagged = curator_api.post("/api/v1/trajectories/curate/", {"ids": [a], "action": "tag"}, format="json")
    forbidden = api.post("/api/v1/trajectories/curate/", {"ids": [b], "action": "reject"}, format="json")

    assert approved.json()["changed"] == 1
    assert Trajectory.objects.get(pk=a).curation_status == "approved"
    assert (both.status_code, "ids" in both.json()) == (400, True)
    assert (empty.status_code, "filter" in empty.json()) == (400, True)
    assert (untagged.status_code, untagged.json()["field"]) == (400, "tags")
    assert forbidden.status_code == 403 and Trajectory.objects.get(pk=b).curation_status == "pending"
