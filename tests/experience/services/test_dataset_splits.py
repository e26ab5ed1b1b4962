"""A build whose split would be empty is refused unless forced, and the manifest says so.

The case that found it: the demo's 14 tasks under the default 0.8 / 0.1 / 0.1 fall 13 / 1 / 0 (seed 0).
"""

from __future__ import annotations

import json

import pytest

from experience.distill.spec import DEFAULT_SPLITS, DatasetSpec
from experience.distill.splits import (
    EmptySplitError,
    empty_splits,
    groups_per_split,
    seed_filling_every_split,
    split_note,
    split_of,
)
from experience.models import Dataset, DatasetVersion, Trajectory
from experience.services import datasets
from tests.experience.services.dataset_store import store_run, store_tasks
from workers.demo.tasks import load_demo_tasks

pytestmark = pytest.mark.django_db
DEMO_TASKS = sorted(task.key for task in load_demo_tasks())


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def test_the_demo_tasks_leave_the_default_test_split_empty():
    counts = groups_per_split(DEMO_TASKS, seed=0, fractions=DEFAULT_SPLITS)

    assert len(DEMO_TASKS) == 14 and counts == {"train": 13, "val": 1, "test": 0}
    assert empty_splits(counts, DEFAULT_SPLITS) == ["test"]
    seed = seed_filling_every_split(DEMO_TASKS, fractions=DEFAULT_SPLITS, after=0)
    assert seed is not None and not empty_splits(groups_per_split(DEMO_TASKS, seed=seed, fractions=DEFAULT_SPLITS),
                                                 DEFAULT_SPLITS)


def test_a_split_given_no_share_is_not_empty_by_mistake():
    fractions = {"train": 0.9, "val": 0.1, "test": 0.0}
    assert empty_splits(groups_per_split(["a"], seed=0, fractions=fractions), fractions) in (["val"], [])
    assert empty_splits({"train": 3, "val": 1, "test": 0}, fractions) == []
    assert seed_filling_every_split(["a"], fractions=DEFAULT_SPLITS, after=0) is None  # 1 task, 3 splits


def test_a_build_of_the_demo_tasks_with_the_default_splits_is_refused_saying_why():
    store_tasks(DEMO_TASKS, good=1, bad=1)
    dataset = datasets.dataset_create(name="demo-value", kind="value")

    with pytest.raises(EmptySplitError) as refused:
        datasets.dataset_version_request(dataset=dataset)

    message = refused.value.message
    assert (refused.value.status_code, refused.value.code, refused.value.field) == (422, "empty_split",
                                                                                    "options.splits")
    assert refused.value.empty == ["test"]
    assert "split test (0.1 of the tasks) would be empty" in message
    assert "the 14 tasks of the usable runs fall 13 in train, 1 in val, 0 in test (seed 0)" in message
    assert "pass force to build anyway" in message and "options.seed=3" in message
    assert not DatasetVersion.objects.exists()


def test_a_forced_build_is_built_and_its_manifest_says_which_split_is_empty_and_that_it_was_forced():
    store_tasks(DEMO_TASKS, good=1, bad=1)
    dataset = datasets.dataset_create(name="demo-value", kind="value")

    version = datasets.dataset_version_request(dataset=dataset, force=True)
    built = datasets.dataset_version_build(version_id=version.pk)

    assert built.status == "ready", built.error
    assert len(built.forced_warnings) == 1 and "split test" in built.forced_warnings[0]
    note = built.manifest["split_check"]
    assert note == {"empty": ["test"], "forced": True, "warnings": built.forced_warnings}
    assert built.manifest["splits"]["test"]["rows"] == 0
    on_disk = json.loads((datasets.version_dir(built) / "manifest.json").read_text())
    assert on_disk["split_check"] == note


def test_a_build_that_fills_every_split_passes_and_its_manifest_says_none_is_empty():
    store_tasks(DEMO_TASKS, good=1, bad=1)
    dataset = datasets.dataset_create(name="demo-seeded", kind="value", options={"seed": 3})

    built = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset).pk)

    assert built.status == "ready", built.error
    assert built.forced_warnings == []
    assert built.manifest["split_check"] == {"empty": [], "forced": False, "warnings": []}
    assert all(built.manifest["splits"][name]["rows"] > 0 for name in ("train", "val", "test"))


def test_only_the_usable_runs_tasks_count():
    store_tasks(DEMO_TASKS, good=1, bad=1)
    dataset = datasets.dataset_create(name="without-one", kind="value", options={"seed": 3})
    split = {task: split_of(task, seed=3, fractions=DEFAULT_SPLITS) for task in DEMO_TASKS}
    in_test = [task for task in DEMO_TASKS if split[task] == "test"]
    assert in_test  # seed 3 fills every split
    Trajectory.objects.filter(task_key__in=in_test).update(curation_status="rejected")  # left out by default

    with pytest.raises(EmptySplitError) as refused:
        datasets.dataset_version_request(dataset=dataset)

    assert refused.value.empty == ["test"]
    assert f"the {14 - len(in_test)} tasks of the usable runs" in refused.value.message


def test_a_pairwise_build_counts_only_tasks_with_both_outcomes():
    for task in DEMO_TASKS:  # one success each: no pair anywhere but in the first three tasks
        store_run(task, good=True)
    for task in DEMO_TASKS[:3]:
        store_run(task, good=False)
    dataset = datasets.dataset_create(name="pairs", kind="pairwise", options={"seed": 3})

    with pytest.raises(EmptySplitError) as refused:
        datasets.dataset_version_request(dataset=dataset)

    assert "the 3 tasks of the usable runs" in refused.value.message


def test_splits_grouped_by_repository_say_repositories():
    for key in ("django__django-1", "django__django-2", "psf__requests-3"):
        store_run(key, good=True)
        store_run(key, good=False)
    dataset = datasets.dataset_create(name="by-repo", kind="value", options={"group_by": "repo"})

    with pytest.raises(EmptySplitError) as refused:
        datasets.dataset_version_request(dataset=dataset)

    assert "the 2 repositories of the usable runs" in refused.value.message
    assert Dataset.objects.filter(name="by-repo").exists() and not DatasetVersion.objects.exists()


def test_the_manifest_note_reads_rows_not_tasks():
    spec = DatasetSpec.from_dict({"kind": "value", "filters": {}})
    splits = {"train": {"rows": 10}, "val": {"rows": 0}, "test": {"rows": 2}}

    assert split_note(spec, splits, forced=[]) == {"empty": ["val"], "forced": False, "warnings": []}
