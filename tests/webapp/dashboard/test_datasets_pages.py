"""The datasets pages: build from the spec form, watch, stats and the balance chart, compare, value curve."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from experience.models import Dataset, Step
from experience.services import datasets
from tests.experience.services.dataset_store import store_run, store_tasks
from tests.webapp.rollouts.jobs_factories import celery_queue  # noqa: F401 (a fixture)
from webapp.access.roles import role_groups_sync
from workers.tasks.datasets import build_dataset_version

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(8)]
FORM = {"kind": "value", "gamma": "0.95", "context_budget_tokens": "8192", "train": "0.5", "val": "0.25",
        "test": "0.25", "group_by": "task", "sft_mode": "truncate", "max_pairs_per_task": "8", "seed": "0"}


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture
def browser(client):
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])  # the role that builds datasets
    client.force_login(user)
    return client


def ready(name: str = "set"):
    dataset = datasets.dataset_get(ref=name) if Dataset.objects.filter(name=name).exists() else (
        datasets.dataset_create(name=name, kind="value"))
    return datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)


def test_the_spec_form_builds_a_dataset_and_the_page_follows_it_to_its_stats(
    browser, celery_queue, django_capture_on_commit_callbacks  # noqa: F811 (a fixture)
):
    store_tasks(TASKS)
    store_run("other", model="policy-b")

    with django_capture_on_commit_callbacks(execute=True):
        response = browser.post("/datasets/", FORM | {"name": "from-form", "models": "policy-a, ", "curation": ["pending"]})

    assert response.status_code == 302 and response["Location"] == "/datasets/from-form/v1/"
    dataset = Dataset.objects.get(name="from-form")
    assert dataset.filters == {"curation": ["pending"], "models": ["policy-a"]}
    assert dataset.options["splits"] == {"train": 0.5, "val": 0.25, "test": 0.25}
    assert [m["task"] for m in celery_queue()] == ["trove.datasets.build"]
    building = browser.get("/datasets/from-form/v1/").content.decode()
    assert "Building…" in building and "/api/v1/datasets/from-form/versions/1/" in building

    build_dataset_version(dataset.versions.get().pk)
    page = browser.get("/datasets/from-form/v1/").content.decode()

    assert '<strong id="rows">144</strong>' in page  # 8 tasks x (2 x 5 + 2 x 4) decisions
    bars = re.findall(r'<rect class="split-(train|val|test)"', page)
    assert len(bars) == len(TASKS), "one bar per task"
    assert "other" not in re.findall(r"<title>([^:]+):", page)
    for split in ("train", "val", "test"):
        assert f'<span class="swatch split-{split}"></span> {split}' in page
    assert 'href="/api/v1/datasets/from-form/versions/1/files/train-00000-of-00001.parquet"' in page


def test_a_spec_matching_nothing_comes_back_to_the_form_with_the_reason(browser):
    store_tasks(TASKS[:2])

    response = browser.post("/datasets/", FORM | {"name": "empty", "models": "nobody"})

    assert response.status_code == 200
    assert "no stored run matches the filters {&quot;models&quot;: [&quot;nobody&quot;]}" in response.content.decode()
    assert not Dataset.objects.exists()


def test_a_failed_build_shows_its_error(browser):
    store_tasks(TASKS[:2])
    version = datasets.dataset_version_request(dataset=datasets.dataset_create(name="broken", kind="value"), force=True)
    datasets.dataset_version_fail(version_id=version.pk, error="database unavailable: gone")

    page = browser.get("/datasets/broken/v1/").content.decode()

    assert '<p class="error" id="version-error">database unavailable: gone</p>' in page


def test_the_dataset_page_lists_versions_and_builds_another(browser, celery_queue):  # noqa: F811
    store_tasks(TASKS[:3])
    ready()

    response = browser.post("/datasets/set/build/", {"force": "1"})  # 3 tasks: val and test would be empty

    assert response.status_code == 302 and response["Location"] == "/datasets/set/v2/"
    page = browser.get("/datasets/set/").content.decode()
    assert "v1</a>" in page and "v2</a>" in page and 'id="compare-form"' in page


def test_compare_shows_that_two_builds_of_the_same_data_are_the_same(browser):
    store_tasks(TASKS[:3])
    ready(), ready()

    page = browser.get("/dataset-compare/", {"a": "set@1", "b": "set@2"}).content.decode()

    assert '<strong id="same-content">yes</strong>' in page and "The same spec." in page


def test_the_pages_take_a_fixed_number_of_queries(browser, django_assert_num_queries):
    store_tasks(TASKS[:2])
    for name in ("a", "b", "c"):
        ready(name)

    with django_assert_num_queries(4):  # session, user, datasets, their latest versions
        assert browser.get("/datasets/").status_code == 200
    with django_assert_num_queries(5):  # session, user, dataset, version, its sibling versions
        assert browser.get("/datasets/a/v1/").status_code == 200
    with django_assert_num_queries(4):  # session, user, dataset, versions
        assert browser.get("/datasets/a/").status_code == 200


def test_the_replay_page_draws_the_value_curve_once_steps_have_estimates(browser):
    run = store_run("task-a")
    # The page shows its value-curve note (and draws the curve) when the run's step index carries estimates:
    # the page itself reads nothing that grows with the run.
    assert browser.get(f"/api/v1/trajectories/{run.pk}/steps/index/").json()["value"] is None
    assert browser.get(f"/trajectories/{run.pk}/").content.decode().count('id="value-curve" hidden') == 1
    calls = list(run.steps.filter(kind="model_call").order_by("seq"))
    for index, step in enumerate(calls):
        step.value_estimate = 0.2 + 0.15 * index
    Step.objects.bulk_update(calls, ["value_estimate"])

    index = browser.get(f"/api/v1/trajectories/{run.pk}/steps/index/").json()
    estimates = [v for v in index["value"] if v is not None]
    assert estimates == [round(0.2 + 0.15 * i, 4) for i in range(len(calls))]
