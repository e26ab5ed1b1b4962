"""Exports: any selection, as Trove JSONL (lossless) or ATIF, streamed run by run."""

from __future__ import annotations

import io
import json
import types

import pytest

from experience.importers import read_all
from experience.models import Trajectory
from experience.services.exporting import export_filters, trajectories_export, trajectories_export_to
from experience.services.importing import trajectories_import_file
from tests.experience.importers.fixture_files import (
    ATIF_SAMPLE,
    BROWSER,
    MINI_V2,
    MULTI_SWE,
    PYDICOM,
    RESOLVER,
)
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


def export(tmp_path, name: str, fmt: str = "trove", **params) -> bytes:
    path = tmp_path / name
    with open(path, "wb") as handle:
        trajectories_export_to(filters=export_filters(params), format=fmt, fileobj=handle)
    return path.read_bytes()


def test_an_export_re_imported_into_an_empty_store_is_the_same_store(tmp_path):
    for path in (PYDICOM, MULTI_SWE, RESOLVER, BROWSER, MINI_V2, ATIF_SAMPLE):
        trajectories_import_file(path=path)
    originals = {r.source_ref: r for path in (PYDICOM, MULTI_SWE, RESOLVER, BROWSER, MINI_V2, ATIF_SAMPLE)
                 for r in read_all(path)}
    first = export(tmp_path, "first.jsonl")
    Trajectory.objects.all().delete()

    trajectories_import_file(path=tmp_path / "first.jsonl")

    assert export(tmp_path, "second.jsonl") == first
    reread = {r.source_ref: r for r in read_all(tmp_path / "second.jsonl")}
    assert reread == originals  # and every run is exactly what its importer read from the original file


def test_atif_export_writes_one_document_per_run_that_reads_back_as_atif(tmp_path):
    ids = stored(run_record(calls=3, task_key="task-a"), run_record(calls=2, task_key="task-b"))

    data = export(tmp_path, "runs.atif.jsonl", fmt="atif")

    documents = [json.loads(line) for line in data.splitlines()]
    assert [d["schema_version"] for d in documents] == ["ATIF-v1.7", "ATIF-v1.7"]
    back = read_all(tmp_path / "runs.atif.jsonl")
    assert [r.task_key for r in back] == ["task-a", "task-b"]
    stored_steps = [t.n_steps for t in Trajectory.objects.filter(pk__in=ids).order_by("id")]
    assert [len(r.steps) for r in back] == stored_steps


def test_an_export_leaves_duplicates_out_unless_asked(tmp_path):
    keep, duplicate = stored(run_record(task_key="t"), run_record(task_key="t"))
    Trajectory.objects.filter(pk=duplicate).update(is_duplicate=True, canonical_id=keep)

    default = export(tmp_path, "default.jsonl")
    everything = export(tmp_path, "all.jsonl", duplicate="any")

    assert len(default.splitlines()) == 1 and len(everything.splitlines()) == 2


def test_an_export_applies_the_selection_filters(tmp_path):
    stored(run_record(model="m-1"), run_record(model="m-2"), run_record(model="m-2"))

    data = export(tmp_path, "m2.jsonl", model="m-2")

    assert [json.loads(line)["model"] for line in data.splitlines()] == ["m-2", "m-2"]


def test_the_export_is_a_stream_of_one_chunk_per_run_in_a_few_queries_per_chunk(django_assert_max_num_queries):
    stored(*[run_record(calls=1) for _ in range(120)])

    stream = trajectories_export(filters=export_filters({}), format="trove")
    assert isinstance(stream, types.GeneratorType)
    with django_assert_max_num_queries(4 * 3 + 1):  # 50 runs a chunk: runs, steps, blobs
        chunks = list(stream)

    assert len(chunks) == 120
    assert all(chunk.endswith(b"\n") and chunk.count(b"\n") == 1 for chunk in chunks)
    buffer = io.BytesIO(b"".join(chunks))
    assert len(buffer.getvalue().splitlines()) == 120
