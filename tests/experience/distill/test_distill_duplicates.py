"""A build leaves out only duplicates of a run with the same outcome, and its manifest counts them."""

from dataclasses import replace

from distill_factories import broken_fix, careful_fix, source_run

from experience.distill.manifest import ManifestBuilder
from experience.distill.selection import exclusion_reason, kept_despite_duplicate_mark
from experience.distill.spec import DatasetSpec
from experience.distill.values import outcome_rows

SPEC = DatasetSpec(kind="outcome", seed=5, splits={"train": 1.0, "val": 0.0, "test": 0.0})


def runs():
    failure = source_run("fail", broken_fix(), task_key="acme__lib-0", success=False)
    success = source_run("win", careful_fix(), task_key="acme__lib-0", success=True)
    same = source_run("again", broken_fix(), task_key="acme__lib-0", success=False, is_duplicate=True)
    # marked against a run whose outcome differs (a stale or hand-made mark): not a duplicate for training
    other = replace(source_run("win-2", careful_fix(), task_key="acme__lib-0", success=True, is_duplicate=True),
                    duplicate_outcome_differs=True)
    return failure, success, same, other


def build(spec=SPEC):
    builder = ManifestBuilder(spec)
    for _ in builder.wrap(outcome_rows(builder.track(runs()), spec)):
        pass
    return builder.finish()


def test_only_a_duplicate_of_a_run_with_the_same_outcome_is_left_out():
    failure, success, same, other = runs()

    assert [exclusion_reason(run, SPEC) for run in (failure, success, same, other)] == [None, None, "duplicate", None]
    assert kept_despite_duplicate_mark(other, SPEC) and not kept_despite_duplicate_mark(same, SPEC)
    with_duplicates = replace(SPEC, include_duplicates=True)
    assert exclusion_reason(same, with_duplicates) is None
    assert not kept_despite_duplicate_mark(other, with_duplicates)


def test_the_manifest_counts_the_duplicates_left_out_and_the_marks_it_overrode():
    manifest = build()

    assert sorted(manifest["source_trajectory_ids"]) == ["fail", "win", "win-2"]
    assert manifest["duplicates"] == {"left_out_same_outcome": 1, "kept_outcome_differs": 1}
    assert manifest["runs_excluded"] == {"duplicate": 1}
    assert build(replace(SPEC, include_duplicates=True))["duplicates"] == {
        "left_out_same_outcome": 0, "kept_outcome_differs": 0}


def test_merged_shards_add_up_their_duplicate_counts():
    whole = ManifestBuilder(SPEC)
    halves = [ManifestBuilder(SPEC), ManifestBuilder(SPEC)]
    for n, run in enumerate(runs()):
        for builder in (whole, halves[n % 2]):
            for _ in builder.wrap(outcome_rows(builder.track([run]), SPEC)):
                pass
    halves[0].merge(halves[1])

    assert halves[0].finish()["duplicates"] == whole.finish()["duplicates"]
