"""Dedup on demo runs made for real: a small rollout job (bubblewrap sandboxes, the demo model behind the
recording proxy, the rollout runner in this process), then dedup and dataset builds. The demo policy
repeats itself, so runs of a task are near duplicates, and its outcomes are mixed: no build may drop the
only success, or the only failure, among near-identical runs of a task."""

from __future__ import annotations

import pytest

from experience.models import DedupCluster, Trajectory
from experience.services.curation import trajectories_outcome_set
from experience.services.dedup import trajectory_dedup
from tests.experience.services.test_dedup_outcomes import build, used
from webapp.rollouts.services import job_create
from workers.rollout_runner import rollout_run
from workers.seed import seed_demo_endpoint

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TASKS = ["calc_expr", "slugify"]
SAMPLES = 6


@pytest.fixture(autouse=True)
def index_dir(settings, tmp_path):
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    settings.TROVE_DEDUP_EMBEDDER = "lexical"
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


@pytest.fixture
def demo_runs(local_backend, proxy, demo_model_url, demo_task_set, demo_fleet) -> list[int]:
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name="trove-demo-stand-in", enqueue=lambda rollout_id: None, task_keys=TASKS,
                     samples_per_task=SAMPLES, max_steps=15)
    for rollout in job.rollouts.order_by("pk"):
        rollout_run(rollout_id=rollout.pk, worker="test-worker")
    ids = list(Trajectory.objects.filter(source="rollout").order_by("pk").values_list("pk", flat=True))
    assert len(ids) == len(TASKS) * SAMPLES
    return ids


def assert_every_outcome_of_a_cluster_is_kept(kept: set[int]) -> None:
    for cluster in DedupCluster.objects.filter(size__gt=1):
        members = list(Trajectory.objects.filter(cluster=cluster))
        outcomes = {(t.success, t.reward) for t in members}
        assert {(t.success, t.reward) for t in members if t.pk in kept} == outcomes, cluster
        assert cluster.mixed_outcomes == (len(outcomes) > 1)


def assert_every_left_out_run_duplicates_a_kept_run_with_its_outcome(ids: list[int], kept: set[int]) -> None:
    for run in Trajectory.objects.filter(pk__in=set(ids) - kept).select_related("canonical"):
        assert run.is_duplicate and run.canonical_id in kept, run.pk
        assert (run.success, run.reward) == (run.canonical.success, run.canonical.reward), run.pk


def test_no_build_of_demo_runs_drops_an_outcome_of_near_identical_runs(demo_runs):
    trajectory_dedup(trajectory_ids=demo_runs)
    assert DedupCluster.objects.filter(size__gt=1).exists()  # the demo's runs of a task are near duplicates

    manifest = build("demo", sources=["rollout"])

    kept = used(manifest)
    assert_every_outcome_of_a_cluster_is_kept(kept)
    assert_every_left_out_run_duplicates_a_kept_run_with_its_outcome(demo_runs, kept)
    for task in TASKS:
        runs = Trajectory.objects.filter(pk__in=demo_runs, task_key=task)
        if runs.filter(success=True).exists():
            assert runs.filter(success=True, pk__in=kept).exists(), task
    assert manifest["duplicates"]["left_out_same_outcome"] == len(demo_runs) - len(kept)
    assert manifest["duplicates"]["kept_outcome_differs"] == 0

    # Graded again later, the biggest cluster's only success is its latest run: it becomes the canonical
    # (the re-derivation runs as each outcome change commits) and the next build keeps it.
    cluster = DedupCluster.objects.filter(size__gt=1).order_by("-size", "pk").first()
    members = list(Trajectory.objects.filter(cluster=cluster).order_by("pk").values_list("pk", flat=True))
    trajectories_outcome_set(trajectories=members[:-1], actor=None, reason="regraded", success=False, reward=0.0)
    trajectories_outcome_set(trajectories=members[-1:], actor=None, reason="regraded", success=True, reward=1.0)

    cluster.refresh_from_db()
    assert cluster.canonical_id == members[-1] and cluster.mixed_outcomes
    regraded = used(build("demo-regraded", sources=["rollout"]))
    assert members[-1] in regraded
    assert_every_outcome_of_a_cluster_is_kept(regraded)
    assert_every_left_out_run_duplicates_a_kept_run_with_its_outcome(demo_runs, regraded)
