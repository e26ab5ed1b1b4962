"""The datasets API warns of an empty split and refuses the build unless forced; a forced version says so."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.models import Dataset, DatasetVersion
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks
from webapp.access.roles import role_groups_sync
from workers.demo.tasks import load_demo_tasks
from workers.tasks.datasets import build_dataset_version

pytestmark = pytest.mark.django_db
DEMO_TASKS = sorted(task.key for task in load_demo_tasks())  # 14 tasks: 13 / 1 / 0 under the default splits


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture(autouse=True)
def demo_runs():
    store_tasks(DEMO_TASKS, good=1, bad=1)


@pytest.fixture
def api() -> APIClient:
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_a_dataset_whose_test_split_would_be_empty_is_a_422_saying_so_and_nothing_is_created(api):
    response = api.post("/api/v1/datasets/", {"name": "demo-value", "kind": "value"}, format="json")

    assert response.status_code == 422, response.json()
    body = response.json()
    assert (body["error"], body["field"]) == ("empty_split", "options.splits")
    assert "split test (0.1 of the tasks) would be empty" in body["detail"]
    assert "13 in train, 1 in val, 0 in test" in body["detail"] and "pass force" in body["detail"]
    assert not Dataset.objects.exists() and not DatasetVersion.objects.exists()


def test_forced_the_version_is_built_keeps_the_warning_and_its_manifest_says_so(api):
    response = api.post("/api/v1/datasets/", {"name": "demo-value", "kind": "value", "force": True}, format="json")

    assert response.status_code == 201, response.json()
    version = response.json()["version"]
    assert len(version["forced_warnings"]) == 1 and "split test" in version["forced_warnings"][0]
    assert build_dataset_version(version["id"]) == "ready"
    detail = api.get(version["url"]).json()
    assert detail["manifest"]["split_check"] == {"empty": ["test"], "forced": True,
                                                 "warnings": version["forced_warnings"]}
    assert detail["manifest"]["splits"]["test"]["rows"] == 0


def test_a_seed_that_fills_every_split_builds_without_force(api):
    response = api.post("/api/v1/datasets/", {"name": "demo-seeded", "kind": "value", "options": {"seed": 3}},
                        format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["version"]["forced_warnings"] == []
    assert build_dataset_version(response.json()["version"]["id"]) == "ready"
    manifest = DatasetVersion.objects.get().manifest
    assert manifest["split_check"] == {"empty": [], "forced": False, "warnings": []}


def test_a_new_version_is_refused_too_unless_forced(api):
    dataset = datasets.dataset_create(name="demo-value", kind="value")

    refused = api.post("/api/v1/datasets/demo-value/versions/")
    bad = api.post("/api/v1/datasets/demo-value/versions/", {"force": "perhaps"}, format="json")
    forced = api.post("/api/v1/datasets/demo-value/versions/", {"force": True}, format="json")

    assert (refused.status_code, refused.json()["error"]) == (422, "empty_split")
    assert bad.status_code == 400 and "force" in bad.json()
    assert forced.status_code == 202, forced.json()
    assert list(dataset.versions.values_list("version", flat=True)) == [1]
    assert "split test" in forced.json()["forced_warnings"][0]
