"""The datasets API with a token: create from a spec, build, poll, download, compare."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.models import Dataset, DatasetVersion
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks
from tests.webapp.rollouts.jobs_factories import celery_queue  # noqa: F401 (a fixture)
from webapp.access.roles import role_groups_sync
from workers.tasks.datasets import build_dataset_version

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(10)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"
    return settings.TROVE_DATASET_DIR


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["researcher"])  # the role that builds datasets
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    client.user = user
    return client


def ready_version(name: str = "set", **options) -> DatasetVersion:
    dataset = datasets.dataset_create(name=name, kind="value", options=options)
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    return datasets.dataset_version_build(version_id=version.pk)


def test_a_trainer_creates_a_dataset_whose_build_is_enqueued_then_polls_it_until_ready(
    api, celery_queue, django_capture_on_commit_callbacks  # noqa: F811 (a fixture)
):
    store_tasks(TASKS)

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/datasets/", {
            "name": "demo-value", "kind": "value", "filters": {"task_sets": ["unit"], "outcome": None},
            "options": {"gamma": 0.9, "splits": {"train": 0.6, "val": 0.2, "test": 0.2}},
        }, format="json")  # fmt: skip

    assert response.status_code == 201, response.json()
    body = response.json()
    dataset = Dataset.objects.get(name="demo-value")
    assert (dataset.created_by, dataset.filters, dataset.options["gamma"]) == (api.user, {"task_sets": ["unit"]}, 0.9)
    assert body["version"]["status"] == "building" and body["version"]["version"] == 1
    messages = celery_queue()
    assert [m["task"] for m in messages] == ["trove.datasets.build"]
    assert messages[0]["argsrepr"] == f"({body['version']['id']},)"

    assert build_dataset_version(body["version"]["id"]) == "ready"  # what the worker runs
    detail = api.get(body["version"]["url"]).json()

    assert detail["status"] == "ready" and detail["row_count"] == detail["manifest"]["rows"] == 180
    assert detail["spec"]["gamma"] == 0.9 and detail["manifest"]["spec"]["filters"] == {"task_sets": ["unit"]}
    names = [f["name"] for f in detail["files"]]
    assert "manifest.json" in names  # one part per split file: the in-line (test) build is one shard
    assert "train-00000-of-00001.jsonl.gz" in names and "train-00000-of-00001.parquet" in names
    assert all(f["url"].startswith("http://testserver/api/v1/datasets/demo-value/versions/1/files/") for f in detail["files"])
    assert build_dataset_version(body["version"]["id"]) == "ready", "a redelivered build does nothing"


def test_a_spec_that_matches_nothing_gets_a_422_naming_the_problem_and_creates_nothing(api):
    store_tasks(TASKS[:2])

    response = api.post("/api/v1/datasets/", {"name": "nothing", "kind": "value",
                                              "filters": {"models": ["gpt-nobody"]}}, format="json")

    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "empty_dataset"
    assert body["detail"] == 'no stored run matches the filters {"models": ["gpt-nobody"]}'
    assert not Dataset.objects.exists() and not DatasetVersion.objects.exists()


@pytest.mark.parametrize(("change", "status", "field"), [
    ({"kind": "regression"}, 400, "kind"),
    ({"options": {"gamma": 1.5}}, 400, "gamma"),
    ({"options": {"splits": {"train": 0.9, "val": 0.2, "test": 0.0}}}, 400, "splits"),
    ({"options": {"colour": "blue"}}, 400, "colour"),
    ({"filters": {"outcome": "sometimes"}}, 400, "filters.outcome"),
    ({"filters": {"dates": ["2024"]}}, 400, "filters.dates"),
    ({"name": "a/b"}, 400, "name"),
])  # fmt: skip
def test_a_bad_spec_gets_a_400_naming_the_field_and_creates_nothing(api, change, status, field):
    store_tasks(TASKS[:2])

    response = api.post("/api/v1/datasets/", {"name": "x", "kind": "value"} | change, format="json")

    assert response.status_code == status, response.json()
    body = response.json()
    assert body.get("field") == field or field in body, body
    assert not Dataset.objects.exists()


def test_a_taken_name_is_a_409(api):
    store_tasks(TASKS[:2])
    ready_version(name="taken")

    response = api.post("/api/v1/datasets/", {"name": "taken", "kind": "outcome"}, format="json")

    assert response.status_code == 409 and response.json()["field"] == "name"


def test_download_with_a_token_streams_the_exact_file(api, dataset_dir):
    store_tasks(TASKS)
    version = ready_version()
    on_disk = (dataset_dir / version.files["train-00000-of-00001.parquet"]).read_bytes()

    response = api.get("/api/v1/datasets/set/versions/1/files/train-00000-of-00001.parquet",
                       HTTP_ACCEPT="application/octet-stream")

    assert response.status_code == 200 and response.streaming
    assert b"".join(response.streaming_content) == on_disk
    assert response["Content-Disposition"] == 'attachment; filename="set-v1-train-00000-of-00001.parquet"'
    assert int(response["Content-Length"]) == len(on_disk)


def test_a_download_needs_a_token_and_a_file_the_version_lists(api):
    store_tasks(TASKS[:3])
    ready_version()

    anonymous = APIClient().get("/api/v1/datasets/set/versions/1/files/train-00000-of-00001.jsonl.gz")
    missing = api.get("/api/v1/datasets/set/versions/1/files/settings.py", HTTP_ACCEPT="application/octet-stream")
    escape = api.get("/api/v1/datasets/set/versions/1/files/..%2F..%2Fsecret")
    unknown_version = api.get("/api/v1/datasets/set/versions/7/files/train-00000-of-00001.jsonl.gz")

    assert anonymous.status_code == 401
    assert missing.status_code == 404 and missing.json()["detail"] == "set v1 has no file 'settings.py'"
    assert escape.status_code == 404
    assert unknown_version.status_code == 404 and unknown_version.json()["detail"] == "dataset 'set' has no version 7"


def test_building_a_new_version_returns_202_and_the_versions_are_listed(api, celery_queue):  # noqa: F811
    store_tasks(TASKS[:4])
    first = ready_version()

    response = api.post("/api/v1/datasets/set/versions/", {"force": True}, format="json")  # 4 tasks: no val, test

    assert response.status_code == 202 and response.json()["version"] == 2
    detail = api.get("/api/v1/datasets/set/").json()
    assert [(v["version"], v["status"]) for v in detail["versions"]] == [(2, "building"), (1, "ready")]
    assert detail["versions"][1]["content_hash"] == first.content_hash


def test_compare_two_versions(api):
    store_tasks(TASKS[:4])
    first = ready_version()
    store_tasks(["task-late"])
    second = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=first.dataset, force=True).pk)

    body = api.get("/api/v1/dataset-versions/compare/", {"a": "set@1", "b": f"{second.pk}"}).json()

    assert body["same_content"] is False
    assert body["runs"] == {"added": 4, "removed": 0, "kept": 16}
    assert body["tasks"]["added"] == ["task-late"]
    bad = api.get("/api/v1/dataset-versions/compare/", {"a": "set@1", "b": "set@nine"})
    assert bad.status_code == 400 and bad.json()["field"] == "version"


def test_the_dataset_list_takes_a_fixed_number_of_queries(api, django_assert_num_queries):
    store_tasks(TASKS[:2])
    for name in ("a", "b", "c"):
        ready_version(name=name)

    with django_assert_num_queries(2):  # the token's user, the page
        body = api.get("/api/v1/datasets/").json()

    assert [(d["name"], d["n_versions"], d["latest_version"]) for d in body["results"]] == [
        ("a", 1, 1), ("b", 1, 1), ("c", 1, 1)]
