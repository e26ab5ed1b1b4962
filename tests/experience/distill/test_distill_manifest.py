from dataclasses import replace

import pytest
from distill_factories import broken_fix, careful_fix, command, source_run

from experience.distill.errors import EmptyDatasetError
from experience.distill.manifest import ManifestBuilder
from experience.distill.rubric import RUBRIC_VERSION
from experience.distill.source import record_content_hash
from experience.distill.spec import DatasetSpec
from experience.distill.values import value_rows
from experience.distill.writers import RowEncoder


def corpus():
    runs = []
    for task in range(12):
        runs.append(source_run(f"{task}-ok", careful_fix(), task_key=f"acme__lib-{task}", success=True))
        runs.append(source_run(f"{task}-bad", broken_fix(), task_key=f"acme__lib-{task}", success=False))
    runs.append(source_run("dup", careful_fix(), task_key="acme__lib-0", is_duplicate=True))
    return runs


def build(runs, spec=None, **versions):
    spec = spec or DatasetSpec(kind="value", seed=5)
    builder = ManifestBuilder(spec, label_versions=versions or None, curation_version="curation-3")
    for _ in builder.wrap(value_rows(builder.track(runs), spec)):
        pass
    return builder.finish()


def test_the_manifest_counts_rows_positives_and_tasks_per_split():
    manifest = build(corpus())

    splits = manifest["splits"]
    assert manifest["rows"] == 12 * (7 + 7) == sum(split["rows"] for split in splits.values())
    for split in splits.values():
        if split["rows"]:
            assert split["positive_rate"] == 0.5  # each task has one 7-step success and one 7-step failure
            assert split["trajectories"] == 2 * split["tasks"]
    assert sum(split["tasks"] for split in splits.values()) == 12
    assert manifest["task_rows"]["acme__lib-3"] == 14
    assert manifest["largest_task_share"] == pytest.approx(1 / 12)


def test_the_manifest_names_its_sources_exclusions_and_label_versions():
    manifest = build(corpus(), rubric_override="x")

    assert len(manifest["source_trajectory_ids"]) == 24
    assert "dup" not in manifest["source_trajectory_ids"]
    assert manifest["runs_offered"] == 25
    assert manifest["runs_excluded"] == {"duplicate": 1}
    assert manifest["label_versions"]["rubric"] == RUBRIC_VERSION == "rubric-2"
    assert manifest["label_versions"]["rubric_override"] == "x"
    assert manifest["curation_version"] == "curation-3"
    assert manifest["spec"] == DatasetSpec(kind="value", seed=5).to_dict()


def test_the_content_hash_is_stable_across_rebuilds_and_input_order():
    first = build(corpus())["content_hash"]
    again = build(corpus())["content_hash"]
    shuffled = build(corpus()[::-1])["content_hash"]

    assert first == again == shuffled


def test_the_content_hash_changes_with_the_data_or_the_spec():
    baseline = build(corpus())["content_hash"]

    changed_output = corpus()
    steps = careful_fix()
    steps[-1] = command("pytest", "121 passed in 3.1s", 0)
    changed_output[0] = source_run("0-ok", steps, task_key="acme__lib-0", success=True)

    relabelled = corpus()
    relabelled[1] = source_run("1-bad", broken_fix(), task_key="acme__lib-0", success=True)

    rehashed = corpus()
    rehashed[2] = replace(rehashed[2], content_hash="f" * 64)

    assert build(changed_output)["content_hash"] != baseline
    assert build(relabelled)["content_hash"] != baseline
    assert build(rehashed)["content_hash"] != baseline
    assert build(corpus(), DatasetSpec(kind="value", seed=5, gamma=0.9))["content_hash"] != baseline
    assert build(corpus()[:-3])["content_hash"] != baseline


def test_a_run_content_hash_defaults_to_the_hash_of_its_record():
    run = source_run("r", careful_fix())

    assert run.resolved_hash() == record_content_hash(run.record)
    assert record_content_hash(source_run("r", broken_fix()).record) != run.resolved_hash()


def test_a_spec_that_matches_nothing_raises_empty_dataset_error():
    only_duplicates = [
        source_run("d1", careful_fix(), is_duplicate=True),
        source_run("d2", careful_fix(), curation="rejected"),
    ]

    with pytest.raises(EmptyDatasetError, match="duplicate: 1, rejected: 1"):
        build(only_duplicates)
    with pytest.raises(EmptyDatasetError):
        build([])


def test_rows_observed_with_their_encoded_lines_give_the_same_hash_as_rows_encoded_by_the_builder():
    spec = DatasetSpec(kind="value", seed=5)
    encoder = RowEncoder()
    builder = ManifestBuilder(spec, curation_version="curation-3")
    for row in value_rows(builder.track(corpus()), spec):
        builder.observe(row, encoder.encode(row))

    assert builder.finish()["content_hash"] == build(corpus())["content_hash"]
