"""The dataset form warns of an empty split and builds only when told to; the version page says so."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from experience.models import Dataset
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks
from webapp.access.roles import role_groups_sync
from workers.demo.tasks import load_demo_tasks
from workers.tasks.datasets import build_dataset_version

pytestmark = pytest.mark.django_db
DEMO_TASKS = sorted(task.key for task in load_demo_tasks())  # 14 tasks: 13 / 1 / 0 under the default splits
FORM = {"name": "demo-value", "kind": "value", "gamma": "0.95", "context_budget_tokens": "8192", "train": "0.8",
        "val": "0.1", "test": "0.1", "group_by": "task", "sft_mode": "truncate", "max_pairs_per_task": "8",
        "seed": "0"}


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture(autouse=True)
def demo_runs():
    store_tasks(DEMO_TASKS, good=1, bad=1)


@pytest.fixture
def browser(client):
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client.force_login(user)
    return client


def test_the_form_warns_of_the_empty_test_split_and_builds_nothing(browser):
    response = browser.post("/datasets/", FORM)

    page = response.content.decode()
    assert response.status_code == 200
    assert "Warning: split test (0.1 of the tasks) would be empty" in page
    assert "13 in train, 1 in val, 0 in test" in page and "use options.seed=3" in page
    assert 'name="force"' in page and "Build even if a split is empty" in page
    assert not Dataset.objects.exists()


def test_ticked_the_form_builds_and_the_version_page_shows_the_empty_split(browser):
    response = browser.post("/datasets/", FORM | {"force": "on"})

    assert response.status_code == 302 and response["Location"] == "/datasets/demo-value/v1/"
    version = Dataset.objects.get(name="demo-value").versions.get()
    assert "split test" in version.forced_warnings[0]
    build_dataset_version(version.pk)
    page = browser.get("/datasets/demo-value/v1/").content.decode()
    assert '<p class="error" id="empty-splits">Empty split: test (built anyway: split test' in page


def test_building_another_version_warns_and_builds_when_ticked(browser):
    datasets.dataset_create(name="demo-value", kind="value")

    refused = browser.post("/datasets/demo-value/build/")
    forced = browser.post("/datasets/demo-value/build/", {"force": "1"})

    assert refused.status_code == 422
    assert "split test (0.1 of the tasks) would be empty" in refused.content.decode()
    assert 'id="build-force"' in refused.content.decode()
    assert forced.status_code == 302 and forced["Location"] == "/datasets/demo-value/v1/"
