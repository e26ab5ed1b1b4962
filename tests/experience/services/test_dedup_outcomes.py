"""Dedup never hides a success behind a failure, in the store: runs with no actions join no cluster, runs
whose outcomes differ are never duplicates of each other, canonicals follow the rule and are re-derived
when outcomes, curation or the rule change, and dataset builds leave out only duplicates of a run with the
same outcome (and count them). On runs made by the factories and on the real SWE-agent fixture runs."""

from __future__ import annotations

import pytest

from experience.dedup.canonical import CANONICAL_RULE_VERSION
from experience.models import CurationEvent, DedupCluster, Trajectory
from experience.records import StepRecord
from experience.services import datasets
from experience.services import dedup as dedup_service
from experience.services.curation import trajectories_curate, trajectories_outcome_set
from experience.services.dedup import (
    cluster_list,
    clusters_rederive_stale,
    dedup_pending,
    same_outcome_duplicates,
    trajectory_dedup,
)
from tests.experience.importers.fixture_files import DEMOS
from tests.experience.services.store_factories import RunFactory, StepFactory, stored
from tests.experience.services.test_dedup import MARSHMALLOW, imported

pytestmark = pytest.mark.django_db
ALL_TRAIN = {"train": 1.0, "val": 0.0, "test": 0.0}  # one split: the question here is which runs, not where
PLAN = ["ls -F", "cat src/calc.py", "python reproduce.py", "sed -i 's/a - b/a + b/' src/calc.py",
        "python -m pytest -q tests/test_calc.py", "git diff", "submit"]


@pytest.fixture(autouse=True)
def index_dir(settings, tmp_path):
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    settings.TROVE_DEDUP_EMBEDDER = "lexical"
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def acting(commands, *, task="calc", **outcome):
    return RunFactory(task_key=task, steps=[StepFactory(command=c) for c in commands], **outcome)


def quiet(*, task="calc", **outcome):
    """A run whose steps hold no action: a model call without a tool call, a note."""
    steps = [StepRecord(kind="model_call", response_text="Nothing to change."), StepRecord(kind="note", text="done")]
    return RunFactory(task_key=task, steps=steps, **outcome)


def state(pk: int) -> tuple:
    t = Trajectory.objects.get(pk=pk)
    return t.cluster_id, t.is_duplicate, t.canonical_id


def build(name: str, **filters) -> dict:
    dataset = datasets.dataset_create(name=name, kind="outcome", filters=filters, options={"splits": ALL_TRAIN})
    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset).pk)
    assert version.status == "ready", version.error
    return version.manifest


def used(manifest: dict) -> set[int]:
    return {int(pk) for pk in manifest["source_trajectory_ids"]}


def set_outcome(ids, *, success: bool, reward: float, captured) -> None:
    with captured(execute=True):  # the re-derivation runs when the outcome change commits
        trajectories_outcome_set(trajectories=ids, actor=None, reason="graded by hand", success=success,
                                 reward=reward)


def test_runs_with_no_actions_have_no_exact_hash_join_no_cluster_and_all_reach_a_build():
    failed, solved, acted = stored(quiet(reward=0.0, success=False), quiet(reward=1.0, success=True),
                                   acting(["ls"], reward=0.0, success=False))

    report = trajectory_dedup(trajectory_ids=[failed, solved, acted])

    rows = {t.pk: t for t in Trajectory.objects.filter(pk__in=[failed, solved, acted])}
    assert rows[failed].content_hash == rows[solved].content_hash == ""
    assert all(t.cluster_id is None and not t.is_duplicate for t in rows.values())
    assert report.duplicates == 0 and not DedupCluster.objects.exists()
    manifest = build("quiet", task_keys=["calc"])
    assert used(manifest) == {failed, solved, acted}
    assert manifest["duplicates"] == {"left_out_same_outcome": 0, "kept_outcome_differs": 0}


def test_exact_copies_whose_outcomes_differ_share_a_mixed_cluster_and_neither_is_a_duplicate():
    failed, solved = stored(acting(PLAN, reward=0.0, success=False), acting(PLAN, reward=1.0, success=True))

    trajectory_dedup(trajectory_ids=[failed, solved])

    cluster = DedupCluster.objects.get()
    assert cluster.mixed_outcomes and cluster.canonical_id == solved and cluster.size == 2
    assert cluster.canonical_rule == CANONICAL_RULE_VERSION
    assert state(failed) == (cluster.pk, False, None) and state(solved) == (cluster.pk, False, None)
    assert used(build("twins", task_keys=["calc"])) == {failed, solved}


def test_a_near_duplicate_cluster_with_a_failed_first_run_keeps_a_success_and_the_failure():
    variant = [c.replace("reproduce.py", "repro_bug.py") for c in PLAN]
    failed, solved, solved_again = stored(acting(PLAN, reward=0.0, success=False),
                                          acting(variant, reward=1.0, success=True),
                                          acting(PLAN + ["echo done"], reward=1.0, success=True))

    trajectory_dedup(trajectory_ids=[failed, solved, solved_again])

    cluster = DedupCluster.objects.get()
    assert cluster.method == DedupCluster.Method.NEAR and cluster.size == 3 and cluster.mixed_outcomes
    assert cluster.canonical_id == solved  # successful beats earliest
    assert state(solved_again) == (cluster.pk, True, solved)  # a duplicate of a success
    assert state(failed) == (cluster.pk, False, None)  # the failure stands for the failures
    manifest = build("near", task_keys=["calc"])
    assert used(manifest) == {failed, solved}
    assert manifest["duplicates"] == {"left_out_same_outcome": 1, "kept_outcome_differs": 0}
    assert manifest["runs_excluded"] == {"duplicate": 1}


def test_an_outcome_labelled_later_re_derives_the_canonical_and_the_marks(django_capture_on_commit_callbacks):
    first, second, third = stored(acting(PLAN), acting(PLAN), acting(PLAN))  # no outcome yet
    trajectory_dedup(trajectory_ids=[first, second, third])
    cluster = DedupCluster.objects.get()
    assert cluster.canonical_id == first and not cluster.mixed_outcomes
    assert state(second)[1:] == state(third)[1:] == (True, first)

    set_outcome([first, second], success=False, reward=0.0, captured=django_capture_on_commit_callbacks)
    set_outcome([third], success=True, reward=1.0, captured=django_capture_on_commit_callbacks)

    cluster.refresh_from_db()
    assert cluster.canonical_id == third and cluster.mixed_outcomes
    assert state(third) == (cluster.pk, False, None)
    assert state(first) == (cluster.pk, False, None) and state(second) == (cluster.pk, True, first)
    assert CurationEvent.objects.filter(action="set_outcome").count() == 3  # the edits are recorded
    assert used(build("labelled-later", task_keys=["calc"])) == {first, third}

    with django_capture_on_commit_callbacks(execute=True):
        trajectories_curate(trajectories=[second], action="approve", actor=None, reason="careful run")

    assert state(second) == (cluster.pk, False, None) and state(first) == (cluster.pk, True, second)


def test_a_success_edited_to_a_failure_stops_being_the_canonical(django_capture_on_commit_callbacks):
    solved, failed = stored(acting(PLAN, reward=1.0, success=True), acting(PLAN, reward=0.0, success=False))
    later = stored(acting(PLAN, reward=1.0, success=True))[0]
    trajectory_dedup(trajectory_ids=[solved, failed, later])
    assert state(later)[1:] == (True, solved)

    set_outcome([solved], success=False, reward=0.0, captured=django_capture_on_commit_callbacks)

    cluster = DedupCluster.objects.get()
    assert cluster.canonical_id == later and state(later)[1:] == (False, None)
    assert state(solved)[1:] == (False, None)  # now the earliest failure: it stands for the failures
    assert state(failed)[1:] == (True, solved)


def test_changing_the_rule_version_re_derives_every_cluster(monkeypatch):
    failed, solved = stored(acting(PLAN, reward=0.0, success=False), acting(PLAN, reward=1.0, success=True))
    other = stored(acting(["make test"], task="other"), acting(["make test"], task="other"))
    trajectory_dedup(trajectory_ids=[failed, solved, *other])
    assert clusters_rederive_stale() == 0  # all derived under the current rule

    monkeypatch.setattr(dedup_service, "CANONICAL_RULE_VERSION", CANONICAL_RULE_VERSION + 1)

    assert clusters_rederive_stale() == 2
    assert set(DedupCluster.objects.values_list("canonical_rule", flat=True)) == {CANONICAL_RULE_VERSION + 1}
    assert clusters_rederive_stale() == 0


def test_the_beat_re_derives_clusters_left_by_the_old_rule():
    """A store deduplicated before outcomes counted: a success marked a duplicate of a failure, and two runs
    with no actions sharing one hash in an exact cluster. The dedup beat repairs both."""
    failed, solved = stored(acting(PLAN, reward=0.0, success=False), acting(PLAN, reward=1.0, success=True))
    quiet_failed, quiet_solved = stored(quiet(reward=0.0, success=False), quiet(reward=1.0, success=True))
    trajectory_dedup(trajectory_ids=[failed, solved, quiet_failed, quiet_solved])
    legacy = DedupCluster.objects.get()
    DedupCluster.objects.filter(pk=legacy.pk).update(canonical=failed, canonical_rule=0, mixed_outcomes=False)
    Trajectory.objects.filter(pk=solved).update(is_duplicate=True, canonical=failed)
    empty = DedupCluster.objects.create(task_key="calc", method="exact", canonical_id=quiet_failed, size=2)
    Trajectory.objects.filter(pk__in=[quiet_failed, quiet_solved]).update(cluster=empty, content_hash="0" * 64)
    Trajectory.objects.filter(pk=quiet_solved).update(is_duplicate=True, canonical=quiet_failed)

    report = dedup_pending()

    assert report.rederived == 2
    legacy.refresh_from_db()
    assert legacy.canonical_id == solved and legacy.mixed_outcomes and legacy.canonical_rule == CANONICAL_RULE_VERSION
    assert state(solved) == (legacy.pk, False, None) and state(failed) == (legacy.pk, False, None)
    assert not DedupCluster.objects.filter(pk=empty.pk).exists()
    for pk in (quiet_failed, quiet_solved):
        assert state(pk) == (None, False, None) and Trajectory.objects.get(pk=pk).content_hash == ""


def test_a_mark_against_a_run_with_another_outcome_leaves_nothing_out():
    """A curator's mark (or one left stale) that files a success under a failure: the build keeps the
    success and counts it; a mark against a run with the same outcome still leaves the run out."""
    failed, solved, copy = stored(acting(["a"], reward=0.0, success=False), acting(["b"], reward=1.0, success=True),
                                  acting(["c"], reward=0.0, success=False))
    trajectories_curate(trajectories=[solved, copy], action="mark_duplicate", canonical_id=failed, actor=None)

    manifest = build("marks", task_keys=["calc"])

    assert used(manifest) == {failed, solved}
    assert manifest["duplicates"] == {"left_out_same_outcome": 1, "kept_outcome_differs": 1}
    assert set(Trajectory.objects.filter(same_outcome_duplicates()).values_list("pk", flat=True)) == {copy}
    spec = datasets.spec_for(kind="outcome", filters={"task_keys": ["calc"]}, options={"splits": ALL_TRAIN})
    assert set(datasets.usable_runs(spec).values_list("pk", flat=True)) == used(manifest)  # the precheck agrees


def test_a_duplicate_whose_run_is_gone_is_kept():
    failed, copy = stored(acting(["a"], reward=0.0, success=False), acting(["a"], reward=0.0, success=False))
    Trajectory.objects.filter(pk=copy).update(is_duplicate=True, canonical=None)

    assert used(build("orphan", task_keys=["calc"])) == {failed, copy}


def test_the_cluster_list_filters_on_mixed_outcomes():
    failed, solved = stored(acting(PLAN, reward=0.0, success=False), acting(PLAN, reward=1.0, success=True))
    same = stored(acting(["make test"], task="other", reward=1.0), acting(["make test"], task="other", reward=1.0))
    trajectory_dedup(trajectory_ids=[failed, solved, *same])

    mixed = Trajectory.objects.get(pk=failed).cluster_id
    agreed = Trajectory.objects.get(pk=same[0]).cluster_id
    assert [c.pk for c in cluster_list(outcomes="mixed")] == [mixed]
    assert [c.pk for c in cluster_list(outcomes="same")] == [agreed]
    assert {c.pk for c in cluster_list()} == {mixed, agreed}
    with pytest.raises(dedup_service.ValidationError, match="outcomes"):
        cluster_list(outcomes="sometimes")


# --- the real fixture runs ----------------------------------------------------------------------------------


def test_no_build_drops_the_only_success_among_the_marshmallow_runs(django_capture_on_commit_callbacks):
    """The eight marshmallow-1867 runs (one task, eight agent configurations) are near duplicates. Graded
    later, only the last one solved the task: it becomes the canonical and every build keeps it."""
    runs = imported(MARSHMALLOW)
    trajectory_dedup(trajectory_ids=runs)
    cluster = DedupCluster.objects.get(pk=Trajectory.objects.get(pk=runs[0]).cluster_id)
    assert cluster.size == 8 and cluster.canonical_id == runs[0]  # no outcomes yet: the earliest
    only_success = runs[-1]

    set_outcome(runs[:-1], success=False, reward=0.0, captured=django_capture_on_commit_callbacks)
    set_outcome([only_success], success=True, reward=1.0, captured=django_capture_on_commit_callbacks)

    cluster.refresh_from_db()
    assert cluster.canonical_id == only_success and cluster.mixed_outcomes
    assert not Trajectory.objects.get(pk=only_success).is_duplicate
    task = Trajectory.objects.get(pk=only_success).task_key
    for name, extra in (("default", {}), ("successes", {"outcome": "success"})):
        manifest = build(f"marshmallow-{name}", task_keys=[task], **extra)
        assert only_success in used(manifest), name
    manifest = build("marshmallow-all", task_keys=[task])
    assert used(manifest) == {only_success, runs[0]}  # the success and one failure for the failures
    assert manifest["duplicates"] == {"left_out_same_outcome": 6, "kept_outcome_differs": 0}


def test_fixture_runs_of_other_tasks_and_formats_never_lose_an_outcome():
    """Every outcome found among the near-identical runs of a task keeps a run in a build."""
    runs = imported([*MARSHMALLOW, DEMOS / "function_calling_simple.traj", *sorted(DEMOS.glob("human_thought__*/*.traj"))])
    # Give the runs alternating outcomes, as a grader might (written directly: the store's state under test).
    for n, pk in enumerate(runs):
        Trajectory.objects.filter(pk=pk).update(success=n % 3 == 0, reward=float(n % 3 == 0))
    trajectory_dedup(trajectory_ids=runs)

    manifest = build("fixtures", sources=["import"])

    kept = used(manifest)
    for cluster in DedupCluster.objects.all():
        members = list(Trajectory.objects.filter(cluster=cluster))
        outcomes = {t.success for t in members}
        assert outcomes == {t.success for t in members if t.pk in kept}, cluster
        assert cluster.mixed_outcomes == (len(outcomes) > 1)
    assert manifest["duplicates"]["left_out_same_outcome"] == len(set(runs) - kept) > 0
