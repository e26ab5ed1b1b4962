"""A dataset build run by a real Celery worker, as deployed (the threads pool): the build forks its reader
processes from a worker with other threads running, and must give the same dataset as an in-line build
(the same manifest and rows; the files differ, as the readers' shards make each split in parts)."""

from __future__ import annotations

import json
import time

import pytest

from experience.models import DatasetVersion
from experience.services import datasets
from tests.experience.services.dataset_store import store_tasks
from workers.tasks.datasets import enqueue_dataset_build

pytestmark = pytest.mark.django_db(transaction=True)
TASKS = [f"task-{n:02d}" for n in range(12)]
SPEC = {"kind": "value", "filters": {"task_sets": ["unit"]}, "options": {"gamma": 0.9}}


def _wait_until_built(version_id: int, timeout: float = 120) -> DatasetVersion:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        version = DatasetVersion.objects.get(pk=version_id)
        if version.status != DatasetVersion.Status.BUILDING:
            return version
        time.sleep(0.3)
    raise AssertionError(f"dataset version {version_id} still building after {timeout} s")


def test_a_build_in_a_celery_worker_matches_an_in_line_build(celery_worker_process, monkeypatch):
    store_tasks(TASKS)
    dataset = datasets.dataset_create(name="in-worker", **SPEC)
    requested = datasets.dataset_version_request(dataset=dataset, enqueue=enqueue_dataset_build, force=True)

    built = _wait_until_built(requested.pk)

    assert built.status == DatasetVersion.Status.READY, built.error
    monkeypatch.setattr(datasets, "READ_ASIDE", False)  # the reference: read in this process, no fork
    reference = datasets.dataset_create(name="in-line", **SPEC)
    in_line = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=reference, force=True).pk
    )
    assert in_line.status == DatasetVersion.Status.READY, in_line.error
    assert in_line.content_hash == built.content_hash
    assert built.row_count == in_line.row_count > 0
    assert built.manifest["splits"] == in_line.manifest["splits"]
    assert built.manifest["task_rows"] == in_line.manifest["task_rows"]
    assert built.manifest["store"] == in_line.manifest["store"]
    for split in ("train", "val", "test"):
        assert _rows(built, split) == _rows(in_line, split), split


def _rows(version: DatasetVersion, split: str) -> list[str]:
    return sorted(
        json.dumps(row, sort_keys=True) for row in datasets.version_rows(version=version, split=split)
    )
