"""Dedup in the store, on the real SWE-agent runs: the eight marshmallow-1867 runs (one task, eight agent
configurations) cluster; runs of other tasks stay out. The index is an incremental, rebuildable cache."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from experience.dedup.embed import get_embedder
from experience.models import CurationEvent, DedupCluster, Trajectory, TrajectoryEmbedding
from experience.services.dedup import (
    cluster_merge,
    cluster_split,
    dedup_pending,
    embedder_key,
    index_path,
    index_refresh,
    similar_runs,
    trajectory_dedup,
)
from experience.services.importing import trajectories_import_file
from tests.experience.importers.fixture_files import DEMOS
from tests.experience.services.store_factories import RunFactory, StepFactory, stored

pytestmark = pytest.mark.django_db

MARSHMALLOW = sorted(DEMOS.glob("replay__marshmallow-code__marshmallow-1867__*/*.traj"))
OTHERS = [DEMOS / "function_calling_simple.traj",
          *sorted(DEMOS.glob("human_thought__*/*.traj")), *sorted((DEMOS / "ctf").rglob("*.traj"))[:3]]
LEXICAL = get_embedder("lexical")


@pytest.fixture(autouse=True)
def index_dir(settings, tmp_path):
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    settings.TROVE_DEDUP_EMBEDDER = "lexical"
    return settings.TROVE_INDEX_DIR


def imported(paths) -> list[int]:
    ids: list[int] = []
    for path in paths:
        report = trajectories_import_file(path=path)
        assert report.status == "imported", report.error
        ids += report.trajectory_ids
    return ids


def clusters_by_run(ids) -> dict[int, int | None]:
    return dict(Trajectory.objects.filter(pk__in=ids).values_list("pk", "cluster_id"))


@pytest.fixture
def marshmallow_and_others():
    assert len(MARSHMALLOW) == 8
    marshmallow, others = imported(MARSHMALLOW), imported(OTHERS)
    others += stored(RunFactory(task_key="marshmallow-code__marshmallow-1867",
                                steps=[StepFactory(command="rm -rf /"), StepFactory(command="echo done")]))
    return marshmallow, others


def test_the_marshmallow_runs_share_one_cluster_and_other_tasks_stay_out(marshmallow_and_others):
    marshmallow, others = marshmallow_and_others

    report = trajectory_dedup(trajectory_ids=marshmallow + others)

    runs = {t.pk: t for t in Trajectory.objects.filter(pk__in=marshmallow + others)}
    (cluster_id,) = {runs[pk].cluster_id for pk in marshmallow}
    cluster = DedupCluster.objects.get(pk=cluster_id)
    assert cluster_id is not None and cluster.size == 8 and cluster.canonical_id == min(marshmallow)
    assert all(runs[pk].cluster_id != cluster_id for pk in others)
    canonical = runs[min(marshmallow)]
    assert not canonical.is_duplicate and canonical.canonical_id is None and canonical.similarity == 1.0
    for pk in marshmallow[1:]:
        assert runs[pk].is_duplicate and runs[pk].canonical_id == min(marshmallow)
        assert LEXICAL.threshold * 0.9 < runs[pk].similarity <= 1.0
    assert report.duplicates == 7 and report.embedded == len(marshmallow + others)
    assert TrajectoryEmbedding.objects.filter(embedder=embedder_key(LEXICAL)).count() == len(marshmallow + others)
    assert all(len(t.content_hash) == 64 for t in runs.values())


def test_dedup_is_idempotent(marshmallow_and_others):
    marshmallow, others = marshmallow_and_others
    trajectory_dedup(trajectory_ids=marshmallow + others)
    before = list(Trajectory.objects.filter(pk__in=marshmallow + others).order_by("pk").values_list(
        "pk", "cluster_id", "canonical_id", "is_duplicate", "similarity", "content_hash"))
    rows_before = sorted(TrajectoryEmbedding.objects.values_list("pk", flat=True))

    again = trajectory_dedup(trajectory_ids=marshmallow + others)

    after = list(Trajectory.objects.filter(pk__in=marshmallow + others).order_by("pk").values_list(
        "pk", "cluster_id", "canonical_id", "is_duplicate", "similarity", "content_hash"))
    assert after == before and again.embedded == 0 and again.duplicates == 0
    assert sorted(TrajectoryEmbedding.objects.values_list("pk", flat=True)) == rows_before
    assert DedupCluster.objects.count() == 1


def test_an_exact_copy_of_a_run_is_an_exact_duplicate():
    steps = [StepFactory(command="ls -F"), StepFactory(command="python reproduce.py"), StepFactory(command="submit")]
    first, copy, other_task = stored(RunFactory(task_key="t-a", steps=steps), RunFactory(task_key="t-a", steps=steps),
                                     RunFactory(task_key="t-b", steps=steps))

    trajectory_dedup(trajectory_ids=[first, copy, other_task])

    copy_row = Trajectory.objects.get(pk=copy)
    assert copy_row.is_duplicate and copy_row.canonical_id == first and copy_row.similarity == 1.0
    assert copy_row.cluster.method == DedupCluster.Method.EXACT
    assert Trajectory.objects.get(pk=other_task).cluster_id is None  # same actions, another task


def test_a_running_trajectory_is_skipped_until_it_finishes():
    (running,) = stored(RunFactory(status="running"))

    report = trajectory_dedup(trajectory_ids=[running])

    assert report.skipped == 1 and not TrajectoryEmbedding.objects.filter(trajectory_id=running).exists()


def test_the_index_grows_incrementally_and_its_mark_follows_the_embedding_rows(marshmallow_and_others):
    marshmallow, others = marshmallow_and_others
    trajectory_dedup(trajectory_ids=marshmallow[:4] + others)
    first = index_refresh()
    mark = first.high_water_mark
    path = index_path(LEXICAL)
    assert mark == TrajectoryEmbedding.objects.latest("id").pk and len(first) == len(marshmallow[:4] + others)

    report = dedup_pending()  # the beat's path: the four runs not yet embedded

    index = index_refresh()
    assert sorted(report.trajectory_ids) == sorted(marshmallow[4:]) and report.duplicates == 4
    assert index.high_water_mark == TrajectoryEmbedding.objects.latest("id").pk > mark
    assert len(index) == len(marshmallow + others) and index.kind == "flat"
    assert path.exists()
    assert len({t for t in clusters_by_run(marshmallow).values()}) == 1


def test_a_deleted_or_corrupt_index_is_rebuilt_to_the_same_clusters(marshmallow_and_others, index_dir):
    marshmallow, others = marshmallow_and_others
    trajectory_dedup(trajectory_ids=marshmallow + others)
    before = clusters_by_run(marshmallow + others)
    path = index_path(LEXICAL)
    path.unlink()

    call_command("dedup", "--rebuild", "--no-progress")

    assert path.exists() and len(index_refresh()) == len(marshmallow + others)
    after = clusters_by_run(marshmallow + others)
    assert after == before  # the rebuild reuses the cluster with the same canonical
    path.write_bytes(b"not an index")
    assert len(index_refresh()) == len(marshmallow + others)


def test_the_backfill_command_dedups_every_pending_run(marshmallow_and_others, capsys):
    marshmallow, others = marshmallow_and_others

    call_command("dedup", "--no-progress")

    assert len(set(clusters_by_run(marshmallow).values())) == 1
    assert not Trajectory.objects.filter(pk__in=marshmallow + others, embeddings__isnull=True).exists()
    assert '"duplicates": 7' in capsys.readouterr().out


def test_similar_runs_ranks_the_same_tasks_runs_first(marshmallow_and_others):
    marshmallow, others = marshmallow_and_others
    trajectory_dedup(trajectory_ids=marshmallow + others)

    same = similar_runs(trajectory_id=marshmallow[0], k=10)
    anywhere = similar_runs(trajectory_id=marshmallow[0], k=20, same_task=False)

    assert {t.pk for t, _ in same} == set(marshmallow[1:]) | {others[-1]}  # the 8th: the factory run of that task
    assert [t.pk for t, _ in same][:7] and set([t.pk for t, _ in same][:7]) == set(marshmallow[1:])
    scores = [s for _, s in anywhere]
    assert scores == sorted(scores, reverse=True) and marshmallow[0] not in {t.pk for t, _ in anywhere}
    assert set(others) <= {t.pk for t, _ in anywhere}


def test_a_curator_splits_a_run_out_and_merges_it_back(marshmallow_and_others, django_user_model):
    marshmallow, others = marshmallow_and_others
    trajectory_dedup(trajectory_ids=marshmallow + others)
    curator = django_user_model.objects.create_user("curator")
    cluster_id = Trajectory.objects.get(pk=marshmallow[0]).cluster_id

    alone = cluster_split(cluster_id=cluster_id, trajectory_id=marshmallow[0], actor=curator, reason="different fix")

    old = DedupCluster.objects.get(pk=cluster_id)
    split_run = Trajectory.objects.get(pk=marshmallow[0])
    assert split_run.cluster_id == alone.pk and not split_run.is_duplicate and split_run.canonical_id is None
    assert old.size == 7 and old.canonical_id == marshmallow[1] and old.method == "manual"
    assert set(Trajectory.objects.filter(cluster=old, is_duplicate=True).values_list("canonical_id", flat=True)) == {
        marshmallow[1]}
    events = CurationEvent.objects.filter(action="split")
    assert events.count() == 8 and {e.actor_id for e in events} == {curator.pk}
    assert {e.reason for e in events} == {"different fix"}
    moved = events.get(trajectory_id=marshmallow[0])
    assert moved.before["cluster_id"] == cluster_id and moved.after["cluster_id"] == alone.pk

    trajectory_dedup(trajectory_ids=marshmallow)  # automatic dedup does not undo the curator
    assert Trajectory.objects.get(pk=marshmallow[0]).cluster_id == alone.pk

    merged = cluster_merge(cluster_id=cluster_id, other_cluster_id=alone.pk, canonical_id=marshmallow[0],
                           actor=curator, reason="same fix after all")

    assert merged.pk == alone.pk and not DedupCluster.objects.filter(pk=cluster_id).exists()
    runs = Trajectory.objects.filter(pk__in=marshmallow)
    assert {t.cluster_id for t in runs} == {merged.pk} and merged.size == 8 and merged.canonical_id == marshmallow[0]
    assert all(t.is_duplicate == (t.pk != marshmallow[0]) and t.similarity is not None for t in runs)
    assert CurationEvent.objects.filter(action="merge", actor=curator).count() == 8
    assert Trajectory.objects.filter(pk__in=marshmallow).count() == 8  # nothing deleted


def test_the_beat_task_dedups_pending_runs(marshmallow_and_others, settings):
    from workers.tasks.dedup import dedup_pending_batch

    marshmallow, others = marshmallow_and_others
    schedule = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}

    result = dedup_pending_batch.apply().get()  # the registered task, run in this process

    assert "trove.experience.dedup_pending" in schedule and dedup_pending_batch.name == "trove.experience.dedup_pending"
    assert result["duplicates"] == 7 and result["placed"] == len(marshmallow + others)
    assert len(set(clusters_by_run(marshmallow).values())) == 1


def test_minilm_embeds_into_its_own_rows_and_index_and_still_clusters_the_marshmallow_runs(marshmallow_and_others):
    marshmallow, others = marshmallow_and_others
    minilm = get_embedder("minilm")

    call_command("dedup", "--embedder", "minilm", "--no-progress")

    assert TrajectoryEmbedding.objects.filter(embedder=embedder_key(minilm)).count() == len(marshmallow + others)
    assert index_path(minilm).exists() and index_path(minilm) != index_path(LEXICAL)
    assert len(set(clusters_by_run(marshmallow).values())) == 1
    assert not set(clusters_by_run(others).values()) & set(clusters_by_run(marshmallow).values())
