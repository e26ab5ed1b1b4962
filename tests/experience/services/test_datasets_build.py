"""Dataset builds from the real store: runs ingested into Postgres, files written to a temporary directory."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import gzip
import hashlib
import json
import multiprocessing
import os
import queue
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from django.db import IntegrityError, transaction

from experience.distill.build import split_parts
from experience.distill.errors import EmptyDatasetError
from experience.distill.rubric import LABELS, RUBRIC_VERSION, per_step_labels
from experience.distill.spec import DatasetSpec
from experience.errors import Conflict, ValidationError
from experience.models import DatasetVersion, Label, Trajectory
from experience.records import MessageRecord, StepRecord
from experience.services import dataset_source, datasets
from experience.services.ingest import trajectory_ingest
from tests.experience.services.dataset_store import rows_of, run_record, store_run, store_tasks

pytestmark = pytest.mark.django_db
TASKS = [f"task-{n:02d}" for n in range(12)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"
    return settings.TROVE_DATASET_DIR


def build(name: str = "set", kind: str = "value", filters=None, **options) -> DatasetVersion:
    dataset = (
        datasets.dataset_get(ref=name)
        if datasets.dataset_list().filter(name=name).exists()
        else (datasets.dataset_create(name=name, kind=kind, filters=filters, options=options))
    )
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    return datasets.dataset_version_build(version_id=version.pk)


def source_ids(version: DatasetVersion) -> set[int]:
    return {int(i) for i in version.manifest["source_trajectory_ids"]}


def test_a_value_build_writes_each_split_as_jsonl_and_parquet_with_a_manifest(dataset_dir):
    store_tasks(TASKS)

    version = build()

    assert version.status == "ready" and version.error == ""
    directory = dataset_dir / "set" / "1"
    assert datasets.version_dir(version) == directory
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["content_hash"] == version.content_hash == version.manifest["content_hash"]
    # 12 tasks x 4 runs; a good run has 5 decisions, a bad one 4: (2 x 5 + 2 x 4) x 12 rows.
    assert version.row_count == manifest["rows"] == 216 == len(rows_of(version))
    for entry in manifest["files"]:
        path = directory / entry["name"]
        assert (
            version.files[entry["name"]] == f"set/1/{entry['name']}" and path.stat().st_size == entry["bytes"]
        )
        if entry["name"].endswith(".parquet"):
            assert pq.read_table(path).num_rows == entry["rows"]
    assert manifest["store"] == {"runs_read": 48, "steps_read": 24 * 10 + 24 * 8}  # two steps a decision
    assert not list(dataset_dir.glob("set/.*")), "no scratch directory is left behind"


def test_no_task_lands_in_two_splits_and_every_task_is_in_one():
    store_tasks(TASKS)

    version = build(splits={"train": 0.5, "val": 0.25, "test": 0.25})

    split_of: dict[str, set[str]] = {}
    for row in rows_of(version):
        split_of.setdefault(row["task_key"], set()).add(row["split"])
    assert set(split_of) == set(TASKS)
    assert all(len(splits) == 1 for splits in split_of.values())
    assert len({next(iter(s)) for s in split_of.values()}) == 3, "12 tasks spread over all three splits"
    assert sum(version.manifest["splits"][s]["tasks"] for s in ("train", "val", "test")) == len(TASKS)


def test_duplicates_and_rejected_runs_are_left_out_but_the_canonical_run_is_kept():
    canonical = store_run("task-a")
    duplicate = store_run("task-a", duplicate_of=canonical)
    rejected = store_run("task-a", good=False, curation="rejected")
    approved = store_run("task-a", good=False, curation="approved")

    version = build()

    assert source_ids(version) == {canonical.pk, approved.pk}
    assert {int(row["trajectory_id"]) for row in rows_of(version)} == {canonical.pk, approved.pk}
    assert version.manifest["runs_excluded"] == {"duplicate": 1, "rejected": 1}
    assert duplicate.pk not in source_ids(version) and rejected.pk not in source_ids(version)


def test_the_spec_can_keep_duplicates_and_rejected_runs():
    canonical = store_run("task-a")
    duplicate = store_run("task-a", duplicate_of=canonical)
    rejected = store_run("task-a", good=False, curation="rejected")

    version = build(include_duplicates=True, include_rejected=True)

    assert source_ids(version) == {canonical.pk, duplicate.pk, rejected.pk}


def test_pairs_are_only_made_within_a_task():
    store_tasks(TASKS[:6], good=2, bad=3)
    store_tasks(["only-wins"], good=3, bad=0)

    version = build(kind="pairwise", max_pairs_per_task=4)

    rows = rows_of(version)
    task_of = dict(Trajectory.objects.values_list("id", "task_key"))
    assert len(rows) == 6 * 4 and "only-wins" not in version.manifest["task_rows"]
    for row in rows:
        chosen, rejected = int(row["chosen_trajectory_id"]), int(row["rejected_trajectory_id"])
        assert task_of[chosen] == task_of[rejected] == row["task_key"]
        assert Trajectory.objects.get(pk=chosen).success and not Trajectory.objects.get(pk=rejected).success


def test_rebuilding_the_same_spec_on_the_same_data_gives_the_same_hash_and_files(dataset_dir):
    store_tasks(TASKS[:4])

    first, second = build(), build()

    assert (first.version, second.version) == (1, 2)
    assert first.content_hash == second.content_hash
    assert [f["sha256"] for f in first.manifest["files"]] == [f["sha256"] for f in second.manifest["files"]]
    assert datasets.version_compare(a=first, b=second)["same_content"] is True


@pytest.mark.parametrize("change", ["new run", "changed reward", "changed output", "run now rejected"])
def test_any_change_in_the_data_changes_the_hash(change):
    runs = store_tasks(TASKS[:4])
    before = build()

    target = runs[0]
    if change == "new run":
        store_run(TASKS[1], good=False)
    elif change == "changed reward":
        Trajectory.objects.filter(pk=target.pk).update(reward=0.5)
    elif change == "changed output":
        step = target.steps.filter(kind="command").order_by("seq").first()
        step.payload = step.payload | {"output": "something else"}
        step.save()
    else:
        Trajectory.objects.filter(pk=target.pk).update(curation_status="rejected")
    after = build()

    assert after.status == "ready" and after.content_hash != before.content_hash


def test_a_spec_that_matches_no_run_is_refused_naming_the_filters_and_records_nothing(dataset_dir):
    store_tasks(TASKS[:2])
    dataset = datasets.dataset_create(name="empty", kind="value", filters={"models": ["nobody"]})

    with pytest.raises(EmptyDatasetError) as raised:
        datasets.dataset_version_request(dataset=dataset, force=True)

    assert "no stored run matches the filters" in raised.value.message and "nobody" in raised.value.message
    assert raised.value.status_code == 422
    assert not dataset.versions.exists() and not (dataset_dir / "empty").exists()


def test_a_spec_whose_matches_are_all_left_out_says_why():
    canonical = store_run("task-a")
    store_run("task-a", duplicate_of=canonical)
    Trajectory.objects.filter(pk=canonical.pk).update(curation_status="rejected")
    store_run("task-b", status="infra_error", success=None, reward=None)
    dataset = datasets.dataset_create(name="gone", kind="value")

    with pytest.raises(EmptyDatasetError) as raised:
        datasets.dataset_version_request(dataset=dataset, force=True)

    assert raised.value.message == (
        "3 runs match the filters but every one is left out "
        "(duplicate: 1, rejected: 1, unfinished, cancelled or infra_error: 1)"
    )


def test_a_pairwise_spec_with_no_task_of_mixed_outcomes_is_refused():
    store_tasks(["a", "b"], good=2, bad=0)
    store_tasks(["c"], good=0, bad=2)
    dataset = datasets.dataset_create(name="nopairs", kind="pairwise")

    with pytest.raises(EmptyDatasetError, match="no task has both a successful and a failed run"):
        datasets.dataset_version_request(dataset=dataset, force=True)


def test_a_build_that_makes_no_rows_fails_with_the_error_and_leaves_no_files(dataset_dir):
    record = run_record("task-a")
    record.steps = [s for s in record.steps if s.kind == "model_call"]
    for step in record.steps:
        step.response_text = ""  # empty replies decide nothing: no decision points, no rows
    from experience.services.ingest import trajectory_ingest

    trajectory_ingest(record=record)
    dataset = datasets.dataset_create(name="nodecisions", kind="value")
    version = datasets.dataset_version_request(dataset=dataset, force=True)

    built = datasets.dataset_version_build(version_id=version.pk)

    assert built.status == "failed" and built.files == {} and built.content_hash == ""
    assert built.error.startswith("the spec matched no rows (1 runs offered")
    assert not any((dataset_dir / "nodecisions").iterdir())


@pytest.mark.parametrize(("filters", "expected"), [
    ({"task_sets": ["other-set"]}, {"other-set"}),
    ({"models": ["policy-b"]}, {"model-b"}),
    ({"harnesses": ["swe-agent"]}, {"harness"}),
    ({"sources": ["api"]}, {"api"}),
    ({"outcome": "failure"}, {"failed"}),
    ({"curation": ["approved"]}, {"approved"}),
    ({"tags": ["gold", "py"]}, {"tagged"}),
    ({"created_after": "2100-01-01"}, set()),
    ({"created_before": "2100-01-01", "task_keys": ["k-late"]}, {"late"}),
])  # fmt: skip
def test_each_filter_selects_exactly_its_runs(filters, expected):
    made = {
        "plain": store_run("k-plain"),
        "other-set": store_run("k-set", task_set="other-set"),
        "model-b": store_run("k-model", model="policy-b"),
        "harness": store_run("k-harness", harness="swe-agent"),
        "api": store_run("k-api", source="api"),
        "failed": store_run("k-failed", good=False),
        "approved": store_run("k-approved", curation="approved"),
        "tagged": store_run("k-tagged", tags=["gold", "py", "x"]),
        "half-tagged": store_run("k-half", tags=["gold"]),
        "late": store_run("k-late"),
    }
    spec = datasets.spec_for(kind="value", filters=filters)

    selected = {int(run.trajectory_id) for run in dataset_source.source_runs(spec)}

    assert selected == {made[name].pk for name in expected}


@pytest.mark.parametrize(("filters", "field"), [
    ({"model": ["x"]}, "filters.model"),
    ({"outcome": "maybe"}, "filters.outcome"),
    ({"curation": ["great"]}, "filters.curation"),
    ({"created_after": "last week"}, "filters.created_after"),
    ({"tags": [1, 2]}, "filters.tags"),
])  # fmt: skip
def test_bad_filters_are_refused_naming_the_field(filters, field):
    with pytest.raises(ValidationError) as raised:
        datasets.dataset_create(name="bad", kind="value", filters=filters)

    assert raised.value.field == field


def test_bad_options_and_names_are_refused_naming_the_field():
    with pytest.raises(ValidationError) as raised:
        datasets.dataset_create(name="ok", kind="value", options={"gamma": 2})
    assert raised.value.field == "gamma"
    with pytest.raises(ValidationError) as raised:
        datasets.dataset_create(name="../escape", kind="value")
    assert raised.value.field == "name"
    datasets.dataset_create(name="taken", kind="value")
    with pytest.raises(Conflict):
        datasets.dataset_create(name="taken", kind="outcome")


def test_equal_filters_in_another_order_make_the_same_spec():
    one = datasets.spec_for(kind="value", filters={"models": ["b", "a", "a"], "tags": "x", "outcome": None})
    two = datasets.spec_for(kind="value", filters={"tags": ["x"], "models": ["a", "b"]})

    assert one == two and one.filters == {"models": ["a", "b"], "tags": ["x"]}


def test_the_read_path_rebuilds_each_run_exactly_as_it_was_ingested():
    record = run_record("task-a", metadata={"seed": 3})
    trajectory = store_run("task-a", metadata={"seed": 3})

    (run,) = list(dataset_source.source_runs(DatasetSpec(kind="value")))

    assert run.trajectory_id == str(trajectory.pk) and run.row_id == trajectory.pk
    assert run.record.steps == record.steps
    assert run.record.instruction == record.instruction and run.record.metadata == {"seed": 3}
    assert list(run.step_ids) == list(trajectory.steps.order_by("seq").values_list("id", flat=True))


def test_the_read_path_rebuilds_every_kind_of_stored_step_field_exactly():
    record = run_record("task-a")
    record.steps += [
        StepRecord(
            kind="command", text="thinking", command="pytest -x", output="x" * 5000, exit_code=1,
            duration_ms=12.5, payload={"cwd": "/repo", "nested": {"a": [1, 2]}},
        ),  # the output in a blob, extra payload fields inline
        StepRecord(
            kind="model_call", request_messages=[MessageRecord("user", "hi")], response_text="r" * 3000,
            response_json={"id": "c1", "choices": []}, model="policy-b", latency_ms=80.0, ttft_ms=20.0,
            tool_calls=[{"id": "t1", "function": {"name": "bash", "arguments": "{}"}}], call_id="call-1",
            tokens_in=5, tokens_out=7,
        ),
        StepRecord(kind="command", command="echo", output="", is_error=True),  # an empty output is kept
        StepRecord(kind="observation", text="nul \x00 byte"),  # Postgres cannot hold it: a payload blob
    ]  # fmt: skip
    trajectory, _ = trajectory_ingest(record=record)

    (run,) = list(dataset_source.source_runs(DatasetSpec(kind="value")))

    assert run.row_id == trajectory.pk
    assert run.record.steps == record.steps


def test_runs_come_ordered_by_task_then_id_across_batches(monkeypatch):
    monkeypatch.setattr(dataset_source, "RUN_BATCH", 3)
    for key in ["b", "a", "c", "a", "b", "a", "c"]:
        store_run(key)

    runs = list(dataset_source.source_runs(DatasetSpec(kind="value")))

    keys = [(run.task_key, run.row_id) for run in runs]
    assert keys == sorted(keys) and len(keys) == 7


def test_a_build_writes_the_rubric_labels_once_with_their_version():
    good = store_run("task-a")
    store_run("task-a", good=False)

    build()
    build()

    labels = Label.objects.filter(trajectory=good, source="rubric")
    assert labels.count() == len(LABELS) and set(labels.values_list("version", flat=True)) == {RUBRIC_VERSION}
    verified = labels.get(name="verified_fix")
    assert verified.value is True
    # verified once the repro passes after the edit: the 4th command, step 7 of the run
    assert verified.step.seq == 7 and verified.step.kind == "command"
    assert (
        labels.get(name="edited_only_tests").value is False
        and labels.get(name="edited_only_tests").step is None
    )


def test_each_rubric_label_names_the_step_after_which_it_last_changed():
    store_run("task-a")
    store_run("task-a", good=False)
    store_run("task-b")

    build()

    for run in dataset_source.source_runs(DatasetSpec(kind="value")):
        per_step = per_step_labels(run.record)
        stored = {label.name: label for label in Label.objects.filter(trajectory_id=run.row_id)}
        assert set(stored) == set(LABELS)
        for name, label in stored.items():
            values = [False] + [labels[name] for labels in per_step]  # before step 0, then after each
            last_change = max((i for i in range(1, len(values)) if values[i] != values[i - 1]), default=None)
            expected_step = run.step_ids[last_change - 1] if last_change is not None else None
            assert (label.value, label.step_id) == (per_step[-1][name], expected_step), name
            assert (
                label.source == "rubric" and label.version == RUBRIC_VERSION and label.created_at is not None
            )


def test_a_finished_version_is_not_built_again_and_a_held_build_is_left_alone():
    store_tasks(TASKS[:2])
    version = build()
    files = dict(version.files)

    again = datasets.dataset_version_build(version_id=version.pk)

    assert again.status == "ready" and again.files == files and again.finished_at == version.finished_at
    pending = datasets.dataset_version_request(dataset=version.dataset, force=True)
    with datasets._build_lock(pending.pk) as held:
        assert held
        from django.db import connections

        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [datasets._LOCK_CLASS, pending.pk])
                assert cursor.fetchone()[0] is False, "a second builder is kept out"
        finally:
            other.close()
    pending.refresh_from_db()
    assert pending.status == "building"


def test_version_numbers_follow_each_other_and_freeze_the_spec():
    store_tasks(TASKS[:2])
    dataset = datasets.dataset_create(name="frozen", kind="value", options={"gamma": 0.9})
    first = datasets.dataset_version_request(dataset=dataset, force=True)
    dataset.options = {"gamma": 0.5}
    dataset.save()
    second = datasets.dataset_version_request(dataset=dataset, force=True)

    assert (first.version, second.version) == (1, 2)
    assert (first.spec["gamma"], second.spec["gamma"]) == (0.9, 0.5)


def test_compare_reports_runs_tasks_and_spec_changes():
    store_tasks(TASKS[:3])
    first = build(name="cmp")
    store_tasks(["task-new"])
    second = build(name="cmp")

    diff = datasets.version_compare(a=first, b=second)

    assert diff["same_content"] is False and diff["spec_changes"] == {}
    assert diff["runs"] == {"added": 4, "removed": 0, "kept": 12}
    assert diff["tasks"]["added"] == ["task-new"] and diff["rows"]["delta"] == 18


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_next_batch_is_fetched_ahead_on_its_own_connection_with_the_same_runs(
    monkeypatch,
):
    monkeypatch.setattr(dataset_source, "RUN_BATCH", 2)
    store_tasks(TASKS[:3], good=1, bad=2)
    canonical = store_run("task-00")
    store_run("task-00", duplicate_of=canonical)
    spec = DatasetSpec(kind="value")
    fetch_threads: set[str] = set()
    real_fetch = dataset_source._fetch

    def watched(ids, instructions=None):
        fetch_threads.add(threading.current_thread().name)
        return real_fetch(ids, instructions)

    monkeypatch.setattr(dataset_source, "_fetch", watched)
    ahead = [(r.row_id, r.step_ids, r.content_hash, r.record) for r in dataset_source.source_runs(spec)]
    monkeypatch.setattr(dataset_source, "PREFETCH", False)
    in_line = [(r.row_id, r.step_ids, r.content_hash, r.record) for r in dataset_source.source_runs(spec)]

    assert len(ahead) == 11 and ahead == in_line
    assert any(name.startswith("dataset-fetch") for name in fetch_threads)
    assert threading.current_thread().name in fetch_threads, "the in-line pass fetched on this thread"


@pytest.mark.django_db(transaction=True)
def test_the_reader_process_collects_garbage_rarely_and_leaves_the_builders_collector_alone(
    monkeypatch, tmp_path
):
    store_tasks(TASKS[:1], good=1, bad=1)
    seen = tmp_path / "reader-gc"
    real_batches = datasets._labelled_batches

    def watched(spec, progress, **options):
        seen.write_text(f"{os.getpid()} {gc.get_threshold()[0]} {gc.get_freeze_count()}")
        yield from real_batches(spec, progress, **options)

    monkeypatch.setattr(datasets, "_labelled_batches", watched)
    threshold = gc.get_threshold()

    assert build(name="gc").status == "ready"

    pid, reader_threshold, frozen = map(int, seen.read_text().split())
    assert pid != os.getpid()
    assert reader_threshold == datasets.READER_GC_THRESHOLD and frozen > 0  # the inherited heap is frozen
    assert gc.get_threshold() == threshold


def share_of(task_key: str, n: int) -> int:
    """The share of n a task falls to: the first byte of its key's sha256, modulo n."""
    return hashlib.sha256(task_key.encode()).digest()[0] % n


def sorted_rows(version: DatasetVersion, split: str) -> list[str]:
    return sorted(
        json.dumps(row, sort_keys=True) for row in datasets.version_rows(version=version, split=split)
    )


def labels_stored() -> list[tuple]:
    return sorted(Label.objects.values_list("trajectory_id", "name", "value", "step_id"))


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_reader_processes_build_shards_and_the_build_is_the_same(monkeypatch, tmp_path):
    monkeypatch.setattr(dataset_source, "RUN_BATCH", 2)
    store_tasks(TASKS[:3], good=1, bad=2)
    assert {share_of(task, 2) for task in TASKS[:3]} == {0, 1}, "each reader has tasks to build"
    pids = tmp_path / "reader-pids"
    real_batches = datasets._labelled_batches

    def watched(spec, progress, *, share=None):
        with pids.open("a") as handle:  # a file: the readers are other processes
            handle.write(f"{os.getpid()} {share}\n")
        yield from real_batches(spec, progress, share=share)

    monkeypatch.setattr(datasets, "_labelled_batches", watched)
    aside = build(name="aside")
    labels_aside = labels_stored()
    again = build(name="aside")  # the same setup again: the same files, byte for byte
    Label.objects.all().delete()
    monkeypatch.setattr(datasets, "READ_ASIDE", False)
    in_line = build(name="in-line")

    *readers, (last_pid, last_share) = [line.split(" ", 1) for line in pids.read_text().splitlines()]
    assert len(readers) == 2 * datasets.READERS == 4
    assert {share for _, share in readers} == {"(0, 2)", "(1, 2)"}, "each reader reads its own share"
    assert len({pid for pid, _ in readers}) == 4 and str(os.getpid()) not in {pid for pid, _ in readers}
    assert (last_pid, last_share) == (str(os.getpid()), "None"), "the in-line build reads everything here"
    assert aside.status == in_line.status == again.status == "ready"
    assert aside.content_hash == in_line.content_hash
    assert aside.row_count == in_line.row_count == aside.manifest["rows"] > 0
    assert aside.manifest["store"] == in_line.manifest["store"] and aside.manifest["store"]["runs_read"] == 9
    assert aside.manifest["splits"] == in_line.manifest["splits"]
    assert aside.manifest["task_rows"] == in_line.manifest["task_rows"]
    for split in ("train", "val", "test"):
        assert sorted_rows(aside, split) == sorted_rows(in_line, split), split
    assert labels_aside == labels_stored() and len(labels_aside) == 9 * len(LABELS)
    assert {f["name"]: f["sha256"] for f in again.manifest["files"]} == {
        f["name"]: f["sha256"] for f in aside.manifest["files"]
    }
    # The in-line build is one shard: a part of one per split. The aside build's parts are numbered over
    # the readers that made rows of the split, in reader order, each holding only its reader's tasks.
    files = {entry["name"]: entry for entry in aside.manifest["files"]}
    assert {entry["name"] for entry in in_line.manifest["files"]} == {
        f"{split}-00000-of-00001.{ext}"
        for split, counts in in_line.manifest["splits"].items()
        if counts["rows"]
        for ext in ("jsonl.gz", "parquet")
    }
    assert set(files) == {name for name in aside.files if name != datasets.MANIFEST_FILE}
    most_parts = 0
    for split, counts in aside.manifest["splits"].items():
        for ext in ("jsonl.gz", "parquet"):
            parts = split_parts(files, split, ext)
            assert parts == [f"{split}-{k:05d}-of-{len(parts):05d}.{ext}" for k in range(len(parts))]
            assert sum(files[part]["rows"] for part in parts) == counts["rows"]
        parts = split_parts(files, split, "jsonl.gz")
        most_parts = max(most_parts, len(parts))
        shares = []
        for part in parts:
            with gzip.open(datasets.version_file(version=aside, name=part), "rt") as handle:
                tasks = {json.loads(line)["task_key"] for line in handle}
            assert len({share_of(task, 2) for task in tasks}) == 1, f"{part} holds one reader's tasks"
            shares.append(share_of(next(iter(tasks)), 2))
        assert shares == sorted(set(shares)), "one part per reader, in reader order"
    assert most_parts == 2, "a split with rows from both readers"


@pytest.mark.django_db(transaction=True)
def test_an_error_in_the_reader_process_fails_the_version_with_that_error(monkeypatch):
    store_tasks(TASKS[:2])

    def broken(spec, progress, **options):
        raise ValueError("the store is on fire")
        yield

    monkeypatch.setattr(datasets, "_labelled_batches", broken)
    version = build(name="broken")

    assert version.status == "failed"
    assert version.error == "internal error: ValueError: the store is on fire"
    assert not Path(datasets.version_dir(version)).exists()


@pytest.mark.parametrize("n", [2, 3])
def test_the_shares_of_the_readers_are_whole_tasks_disjoint_and_together_all_the_runs(monkeypatch, n):
    monkeypatch.setattr(dataset_source, "RUN_BATCH", 3)
    store_tasks(TASKS, good=1, bad=2)
    spec = datasets.spec_for(kind="value")
    every = [run.row_id for run in dataset_source.source_runs(spec)]

    shares = [
        [run for batch in dataset_source.source_run_batches(spec, share=(k, n)) for run in batch]
        for k in range(n)
    ]

    ids = [run.row_id for share in shares for run in share]
    assert len(ids) == len(set(ids)) == len(every) == 3 * len(TASKS) and set(ids) == set(every)
    tasks = [{run.task_key for run in share} for share in shares]
    assert all(tasks), "every share has tasks"
    for k, share in enumerate(tasks):
        assert share == {task for task in TASKS if share_of(task, n) == k}, "whole tasks, by their key's hash"
    for share in shares:
        keys = [(run.task_key, run.row_id) for run in share]
        assert keys == sorted(keys), "each share in store order"


@pytest.mark.timeout(120)  # a dead reader not noticed would leave the builder waiting
@pytest.mark.django_db(transaction=True)
def test_a_reader_killed_mid_build_fails_the_version_naming_it_and_leaves_no_files(monkeypatch, dataset_dir):
    monkeypatch.setattr(dataset_source, "RUN_BATCH", 2)
    monkeypatch.setattr(datasets, "READER_PATIENCE_S", 0.2)
    store_tasks(TASKS[:4], good=1, bad=2)
    assert {share_of(task, 2) for task in TASKS[:4]} == {0, 1}
    builder = os.getpid()
    real_batches = datasets._labelled_batches

    def killed_after_a_batch(spec, progress, *, share=None):
        batches = real_batches(spec, progress, share=share)
        yield next(batches)
        if os.getpid() != builder and share == (1, 2):  # reader 1, once it has written a batch's rows
            os.kill(os.getpid(), signal.SIGKILL)
        yield from batches

    monkeypatch.setattr(datasets, "_labelled_batches", killed_after_a_batch)

    version = build(name="killed")

    assert version.status == "failed"
    assert version.error == (
        "internal error: RuntimeError: dataset reader 1 ended (exit code -9) before it finished its shard"
    )
    assert version.files == {} and not Path(datasets.version_dir(version)).exists()
    assert (dataset_dir / "killed").is_dir()  # where the scratch directory was
    assert list((dataset_dir / "killed").iterdir()) == [], "no scratch directory is left behind"


PR_SET_CHILD_SUBREAPER = 36


def _orphan_a_reader(spec, out_dir, reports, started: Path, verdict: Path) -> None:
    """A process that adopts its orphaned descendants (a subreaper): it starts a go-between that starts a
    reader (`_shard_main`) and leaves once the reader is reading, so the reader's parent is gone; the
    reader comes to this process, which waits for it and writes its exit code to `verdict`."""
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        go_between = multiprocessing.get_context("fork").Process(
            target=_start_a_reader_and_leave, args=(spec, out_dir, reports, started)
        )
        go_between.start()
        go_between.join()
        _, status = os.waitpid(int(started.read_text()), 0)
        verdict.write_text(str(os.waitstatus_to_exitcode(status)))
    except BaseException as error:  # noqa: BLE001 - told to the test
        verdict.write_text(f"{type(error).__name__}: {error}")
    os._exit(0)


def _start_a_reader_and_leave(spec, out_dir, reports, started: Path) -> None:
    reader = multiprocessing.get_context("fork").Process(
        target=datasets._shard_main, args=(spec, (0, 1), out_dir, "curation-event-0", reports)
    )
    reader.start()
    while not started.exists():  # the reader has noted its parent (this process) and is reading
        time.sleep(0.01)
    os._exit(0)  # no atexit: the reader is not ended by multiprocessing


@pytest.mark.django_db(transaction=True)
def test_a_reader_whose_parent_is_gone_ends_at_its_next_progress_report(monkeypatch, tmp_path):
    store_tasks(TASKS[:2], good=1, bad=1)
    monkeypatch.setattr(dataset_source, "PROGRESS_EVERY_S", 0.0)  # a report at each batch
    started, verdict = tmp_path / "reader-pid", tmp_path / "verdict"
    real_batches = datasets._labelled_batches

    def reads_once_its_parent_is_gone(spec, progress, *, share=None):
        parent = os.getppid()
        (tmp_path / "pid.tmp").write_text(str(os.getpid()))
        os.replace(tmp_path / "pid.tmp", started)
        while os.getppid() == parent:
            time.sleep(0.01)
        yield from real_batches(spec, progress, share=share)

    monkeypatch.setattr(datasets, "_labelled_batches", reads_once_its_parent_is_gone)
    context = multiprocessing.get_context("fork")
    reports = context.Queue()
    subreaper = context.Process(
        target=_orphan_a_reader,
        args=(DatasetSpec(kind="value"), tmp_path / "shard-0", reports, started, verdict),
    )

    subreaper.start()
    subreaper.join(timeout=120)

    if subreaper.is_alive():
        subreaper.kill()
        subreaper.join()
        if started.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(started.read_text()), signal.SIGKILL)
        pytest.fail("the orphaned reader did not end")
    assert verdict.read_text() == "1", "the reader ended itself (os._exit(1)) at its next progress report"
    with pytest.raises(queue.Empty):
        reports.get(timeout=1)  # neither progress nor a shard: it told nobody


def test_the_builders_young_collections_are_rare_while_any_build_runs_and_restored_after_the_last():
    before = gc.get_threshold()
    with datasets._collector_relaxed():
        with datasets._collector_relaxed():
            assert gc.get_threshold() == (datasets.BUILD_GC_THRESHOLD, *before[1:])
        assert gc.get_threshold()[0] == datasets.BUILD_GC_THRESHOLD, "another build is still running"
    assert gc.get_threshold() == before


@pytest.mark.django_db
def test_a_build_makes_its_rows_with_the_raised_collection_threshold(monkeypatch):
    store_tasks(TASKS[:1], good=1, bad=1)
    seen = []
    real_labelled = datasets._labelled

    def watched(spec, progress, share=None):
        seen.append(gc.get_threshold()[0])
        yield from real_labelled(spec, progress, share)

    monkeypatch.setattr(datasets, "_labelled", watched)
    before = gc.get_threshold()

    assert build(name="relaxed").status == "ready"

    assert seen == [datasets.BUILD_GC_THRESHOLD] and gc.get_threshold() == before


def test_a_runs_rubric_labels_are_written_once_even_by_writers_that_race():
    store_run("task-a")
    store_run("task-b", good=False)
    runs = list(dataset_source.source_runs(DatasetSpec(kind="value")))
    rows = [
        (run.row_id, step_id, name, value)
        for run in runs
        for name, value, step_id in datasets._label_changes(run)
    ]

    assert datasets._insert_labels(rows) == len(rows) == 2 * len(LABELS)
    # A second writer that read the runs before the first wrote (a build and the beat at the same moment).
    assert datasets._insert_labels(rows) == 0
    assert Label.objects.filter(source="rubric").count() == 2 * len(LABELS)
    with pytest.raises(IntegrityError), transaction.atomic():
        Label.objects.create(trajectory_id=runs[0].row_id, name=LABELS[0], value=True, source="rubric",
                             version=RUBRIC_VERSION)  # fmt: skip
    Label.objects.create(
        trajectory_id=runs[0].row_id, name=LABELS[0], value=True, source="human", version="1"
    )
