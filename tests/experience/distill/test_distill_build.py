import gzip
import json

import pyarrow.parquet as pq
import pytest
from distill_factories import broken_fix, careful_fix, source_run

from experience.distill.build import distill, rows_for
from experience.distill.errors import EmptyDatasetError
from experience.distill.spec import KINDS, DatasetSpec


def corpus():
    runs = []
    for task in range(20):
        key = f"acme__lib-{task:02d}"
        runs.append(source_run(f"{task}-ok", careful_fix(), task_key=key, success=True))
        runs.append(source_run(f"{task}-bad", broken_fix(), task_key=key, success=False))
    return runs


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_builds_per_split_files_that_agree_with_the_manifest(tmp_path, kind):
    manifest = distill(iter(corpus()), DatasetSpec(kind=kind, seed=2), out_dir=tmp_path)

    files = {entry["name"]: entry for entry in manifest["files"]}
    for split, counts in manifest["splits"].items():
        if not counts["rows"]:
            assert f"{split}.jsonl.gz" not in files
            continue
        with gzip.open(tmp_path / f"{split}.jsonl.gz", "rt") as handle:
            jsonl_rows = [json.loads(line) for line in handle]
        parquet_rows = pq.read_table(tmp_path / f"{split}.parquet").num_rows
        assert len(jsonl_rows) == parquet_rows == counts["rows"] == files[f"{split}.jsonl.gz"]["rows"]
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
