"""The dataset pages' review additions: a preview of each split's first rows, the runs a version added and
removed against another, and the manifest as a page."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.contrib.auth import get_user_model

from experience.models import Trajectory
from experience.services import datasets
from tests.experience.services.dataset_store import rows_of, store_tasks

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(8)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture
def reader(client):
    client.force_login(get_user_model().objects.create_user("reader"))
    return client


def build(name: str = "set", **filters):
    dataset = (datasets.dataset_get(ref=name) if datasets.Dataset.objects.filter(name=name).exists()
               else datasets.dataset_create(name=name, kind="outcome", filters=filters))
    return datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)


def test_the_version_page_previews_the_first_rows_of_each_split(reader):
    store_tasks(TASKS)
    version = build()
    rows = rows_of(version)

    page = reader.get(f"/datasets/set/v{version.version}/").content.decode()

    for split in ("train", "val", "test"):  # a table for each split with rows; "No rows." for an empty one
        assert (f'id="preview-{split}"' in page) == any(row["split"] == split for row in rows)
    train = page[page.index('id="preview-train"'):]
    train = train[: train.index("</table>")]
    columns = re.findall(r"<th>([^<]+)</th>", train)
    first_train = next(row for row in rows if row["split"] == "train")
    assert set(columns) >= {"trajectory_id", "split"} and columns == list(dict.fromkeys(columns))
    assert f"<td>{first_train['trajectory_id']}</td>" in train
    assert len(re.findall(r"<tr>", train)) - 1 <= 5


def test_compare_lists_the_runs_added_and_removed(reader):
    runs = store_tasks(TASKS[:4])
    build()
    dropped = runs[0]
    Trajectory.objects.filter(pk=dropped.pk).update(curation_status="rejected")
    added = store_tasks(["task-new"], good=1, bad=1)
    build()

    page = reader.get("/dataset-compare/", {"a": "set@1", "b": "set@2"}).content.decode()

    listed_added = re.findall(r'/trajectories/(\d+)/', page[page.index('id="runs-added"'):page.index('id="runs-removed"')])
    listed_removed = re.findall(r'/trajectories/(\d+)/', page[page.index('id="runs-removed"'):])
    assert sorted(map(int, listed_added)) == sorted(t.pk for t in added)
    assert list(map(int, listed_removed))[:1] == [dropped.pk]


def test_the_manifest_opens_as_a_page(reader):
    store_tasks(TASKS)
    version = build()

    page = reader.get(f"/datasets/set/v{version.version}/manifest/")
    body = page.content.decode()

    assert page.status_code == 200
    assert 'id="m-content_hash"' in body and version.content_hash in body
    assert 'id="manifest-link"' in reader.get(f"/datasets/set/v{version.version}/").content.decode()
    sources = re.search(r'id="m-source_trajectory_ids"><h2>source_trajectory_ids</h2><pre>(.*?)</pre>', body, re.S)[1]
    assert json.loads(html.unescape(sources)) == version.manifest["source_trajectory_ids"]
    assert reader.get("/datasets/set/v99/manifest/").status_code == 404
