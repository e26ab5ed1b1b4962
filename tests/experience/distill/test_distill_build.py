import gzip
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from distill_factories import broken_fix, careful_fix, source_run

from experience.distill.build import (
    distill,
    distill_shard,
    merge_shards,
    part_name,
    rows_for,
    split_parts,
)
from experience.distill.errors import EmptyDatasetError
from experience.distill.manifest import ManifestBuilder
from experience.distill.spec import KINDS, DatasetSpec


def corpus():
    runs = []
    for task in range(20):
        key = f"acme__lib-{task:02d}"
        runs.append(source_run(f"{task}-ok", careful_fix(), task_key=key, success=True))
        runs.append(source_run(f"{task}-bad", broken_fix(), task_key=key, success=False))
    return runs


# `rl` needs calls recorded with token ids, which this corpus has not: tests/experience/distill/test_rl_samples_dataset.py
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "rl"])
def test_every_kind_builds_per_split_files_that_agree_with_the_manifest(tmp_path, kind):
    manifest = distill(iter(corpus()), DatasetSpec(kind=kind, seed=2), out_dir=tmp_path)

    files = {entry["name"]: entry for entry in manifest["files"]}
    assert set(files) == {path.name for path in tmp_path.iterdir()}
    for split, counts in manifest["splits"].items():
        jsonl, parquet = f"{split}-00000-of-00001.jsonl.gz", f"{split}-00000-of-00001.parquet"
        if not counts["rows"]:
            assert split_parts(files, split, "jsonl.gz") == split_parts(files, split, "parquet") == []
            continue
        # One pass is one shard: each split is one part of one.
        assert split_parts(files, split, "jsonl.gz") == [jsonl]
        assert split_parts(files, split, "parquet") == [parquet]
        with gzip.open(tmp_path / jsonl, "rt") as handle:
            jsonl_rows = [json.loads(line) for line in handle]
        parquet_rows = pq.read_table(tmp_path / parquet).num_rows
        assert (
            len(jsonl_rows)
            == parquet_rows
            == counts["rows"]
            == files[jsonl]["rows"]
            == files[parquet]["rows"]
        )
        assert {row["split"] for row in jsonl_rows} == {split}
        assert all(row["kind"] == kind for row in jsonl_rows)


def jsonl_hashes(manifest):
    return {f["name"]: f["sha256"] for f in manifest["files"] if f["name"].endswith(".jsonl.gz")}


def test_a_rebuild_writes_identical_jsonl_and_the_same_hash(tmp_path):
    first = distill(iter(corpus()), DatasetSpec(kind="value"), out_dir=tmp_path / "a")
    second = distill(iter(corpus()), DatasetSpec(kind="value"), out_dir=tmp_path / "b")

    assert first["content_hash"] == second["content_hash"]
    assert jsonl_hashes(first) == jsonl_hashes(second)


def test_an_empty_build_raises_and_leaves_no_files(tmp_path):
    runs = [source_run("d", careful_fix(), is_duplicate=True)]

    with pytest.raises(EmptyDatasetError):
        distill(iter(runs), DatasetSpec(kind="value"), out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_rows_for_dispatches_on_the_kind():
    runs = corpus()[:2]

    assert {row["kind"] for row in rows_for(runs, DatasetSpec(kind="pairwise"))} == {"pairwise"}
    assert len(list(rows_for(runs, DatasetSpec(kind="outcome")))) == 2


def jsonl_rows(directory, names):
    rows = []
    for name in names:
        with gzip.open(directory / name, "rt") as handle:
            rows += [json.loads(line) for line in handle]
    return rows


def canonical(rows):
    """Rows as a multiset (order left out)."""
    return Counter(json.dumps(row, sort_keys=True) for row in rows)


def manifest_content(manifest):
    return {key: value for key, value in manifest.items() if key != "files"}


@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "rl"])  # rl: see above
def test_two_shards_of_whole_tasks_merge_into_the_manifest_and_rows_of_one_pass(tmp_path, kind):
    spec = DatasetSpec(kind=kind, seed=2, splits={"train": 0.5, "val": 0.25, "test": 0.25})
    runs = corpus()
    # Whole tasks to each shard, as the build's readers take them: the even tasks, then the odd ones.
    tasks = [{run.task_key for run in runs if int(run.task_key[-2:]) % 2 == k} for k in (0, 1)]
    single = distill(iter(runs), spec, out_dir=tmp_path / "single")
    shards = [
        distill_shard(
            (run for run in runs if run.task_key in tasks[k]),
            spec,
            out_dir=tmp_path / "scratch" / f"shard-{k}",
        )
        for k in (0, 1)
    ]
    shard_files = [{result.path for result in shard.files} for shard in shards]
    shard_rows = {  # (shard, split file): its rows, as the shard wrote them
        (k, Path(path).name): jsonl_rows(Path(path).parent, [Path(path).name])
        for k in (0, 1)
        for path in shard_files[k]
        if path.endswith(".jsonl.gz")
    }

    merged = merge_shards(shards, out_dir=tmp_path / "scratch")

    assert manifest_content(merged) == manifest_content(single)  # content hash, splits, task rows, sources
    assert merged["content_hash"] == single["content_hash"] and merged["rows"] == single["rows"] > 0
    assert [list((tmp_path / "scratch" / f"shard-{k}").iterdir()) for k in (0, 1)] == [[], []], "moved"
    assert not any(Path(path).exists() for files in shard_files for path in files)
    names = {entry["name"]: entry for entry in merged["files"]}
    assert set(names) == {path.name for path in (tmp_path / "scratch").iterdir() if path.is_file()}
    assert len(split_parts(names, "train", "jsonl.gz")) == 2, "both shards made training rows"
    for split, counts in merged["splits"].items():
        parts = split_parts(names, split, "jsonl.gz")
        # A part for each shard that made rows of the split, numbered in shard order.
        writers = [k for k in (0, 1) if any(Path(p).name == f"{split}.jsonl.gz" for p in shard_files[k])]
        assert parts == [part_name(f"{split}.jsonl.gz", i, len(writers)) for i in range(len(writers))]
        assert split_parts(names, split, "parquet") == [p.replace(".jsonl.gz", ".parquet") for p in parts]
        part_rows = [jsonl_rows(tmp_path / "scratch", [part]) for part in parts]
        for k, rows in zip(writers, part_rows, strict=True):
            assert rows == shard_rows[k, f"{split}.jsonl.gz"], "part i is the i-th writing shard's file"
            assert {row["task_key"] for row in rows} <= tasks[k], "a part holds only its shard's tasks"
        for part, rows in zip(parts, part_rows, strict=True):
            parquet = part.replace(".jsonl.gz", ".parquet")
            assert len(rows) == names[part]["rows"] == names[parquet]["rows"]
            assert pq.read_table(tmp_path / "scratch" / parquet).num_rows == len(rows)
        assert sum(len(rows) for rows in part_rows) == counts["rows"]
        single_rows = jsonl_rows(
            tmp_path / "single", split_parts([entry["name"] for entry in single["files"]], split, "jsonl.gz")
        )
        assert canonical(row for rows in part_rows for row in rows) == canonical(single_rows)


def test_a_split_only_one_shard_made_rows_of_is_one_part(tmp_path):
    spec = DatasetSpec(kind="outcome")
    runs = corpus()
    shards = [
        distill_shard(iter([]), spec, out_dir=tmp_path / "shard-0"),  # its tasks made no rows
        distill_shard(iter(runs), spec, out_dir=tmp_path / "shard-1"),
    ]

    merged = merge_shards(shards, out_dir=tmp_path)

    assert shards[0].files == [] and merged["rows"] == len(runs)
    names = [entry["name"] for entry in merged["files"]]
    for split, counts in merged["splits"].items():
        if counts["rows"]:
            assert split_parts(names, split, "jsonl.gz") == [f"{split}-00000-of-00001.jsonl.gz"]


def test_merging_shards_that_made_no_rows_raises_and_leaves_no_files(tmp_path):
    spec = DatasetSpec(kind="value")
    duplicates = [source_run("d", careful_fix(), is_duplicate=True)]
    shards = [
        distill_shard(iter(duplicates), spec, out_dir=tmp_path / "shard-0"),
        distill_shard(iter([]), spec, out_dir=tmp_path / "shard-1"),
    ]

    with pytest.raises(EmptyDatasetError, match=r"1 runs offered; excluded: duplicate: 1"):
        merge_shards(shards, out_dir=tmp_path)
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_an_empty_merge_removes_the_files_a_shard_did_write(tmp_path):
    spec = DatasetSpec(kind="value")
    shard = distill_shard(iter(corpus()[:2]), spec, out_dir=tmp_path / "shard-0")
    assert shard.files, "the shard wrote its rows"
    # As if that shard's rows had not counted: its manifest is replaced by an empty one of the same spec.
    shard.manifest = ManifestBuilder(spec)

    with pytest.raises(EmptyDatasetError):
        merge_shards([shard], out_dir=tmp_path)
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_a_manifest_builder_refuses_to_merge_one_of_another_spec():
    builder = ManifestBuilder(DatasetSpec(kind="value"))
    other = ManifestBuilder(DatasetSpec(kind="value", seed=1))

    with pytest.raises(ValueError, match="same spec"):
        builder.merge(other)
    with pytest.raises(ValueError, match="same spec"):
        builder.merge(ManifestBuilder(DatasetSpec(kind="outcome")))
    builder.merge(ManifestBuilder(DatasetSpec(kind="value")))  # the same spec merges


def test_part_names_number_a_splits_parts_and_split_parts_lists_them_in_order():
    assert part_name("train.parquet", 0, 2) == "train-00000-of-00002.parquet"
    assert part_name("val.jsonl.gz", 11, 12) == "val-00011-of-00012.jsonl.gz"
    names = [
        "train-00002-of-00003.jsonl.gz", "manifest.json", "train-00000-of-00003.parquet",
        "test-00000-of-00001.jsonl.gz", "train-00000-of-00003.jsonl.gz", "val-00000-of-00002.jsonl.gz",
        "train-00001-of-00003.jsonl.gz", "train.jsonl.gz", "val-00001-of-00002.jsonl.gz",
    ]  # fmt: skip

    assert split_parts(names, "train", "jsonl.gz") == [
        "train-00000-of-00003.jsonl.gz", "train-00001-of-00003.jsonl.gz", "train-00002-of-00003.jsonl.gz",
    ]  # fmt: skip
    assert split_parts(names, "train", "parquet") == ["train-00000-of-00003.parquet"]
    assert split_parts(names, "val", "jsonl.gz") == [
        "val-00000-of-00002.jsonl.gz",
        "val-00001-of-00002.jsonl.gz",
    ]
    assert split_parts(names, "test", "parquet") == []
    assert split_parts(iter(names), "test", "jsonl.gz") == ["test-00000-of-00001.jsonl.gz"]
