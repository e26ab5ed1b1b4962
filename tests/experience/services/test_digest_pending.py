"""Digests derived after ingest (`datasets.digest_pending_runs`, `datasets.digests_derive_pending`): the
beat's `trove.datasets.digest_pending` and `manage.py digest_runs` keep the digest (and write the rubric
labels) of each finished run with an outcome and steps that has no digest of this version, so that value
builds read digests instead of steps. Postgres only."""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from experience.distill.digest import DIGEST_VERSION, RunDigest
from experience.distill.rubric import LABELS, RUBRIC_VERSION
from experience.models import DatasetVersion, Label, Step, Trajectory, TrajectoryDigest
from experience.services import dataset_source, datasets
from experience.services.ingest import trajectory_ingest
from tests.experience.services.dataset_store import run_record, same_content, store_run, store_tasks

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("digests_dataset_dir")]
TASKS = [f"task-{n:02d}" for n in range(4)]


# --- helpers ---------------------------------------------------------------------------------------------


def build(name: str = "set", **options) -> DatasetVersion:
    dataset = (
        datasets.dataset_get(ref=name)
        if datasets.dataset_list().filter(name=name).exists()
        else datasets.dataset_create(name=name, kind="value", options=options)
    )
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    built = datasets.dataset_version_build(version_id=version.pk)
    assert built.status == "ready", built.error
    return built


def digest_rows() -> dict[int, tuple]:
    """Every kept digest, as what it says (its creation time aside)."""
    return {
        digest.trajectory_id: (
            digest.version,
            digest.instruction_sha256,
            digest.steps_sha256,
            digest.n_steps,
            digest.labels,
            bytes(digest.data),
        )
        for digest in TrajectoryDigest.objects.all()
    }


def rubric_labels() -> list[tuple]:
    return sorted(
        Label.objects.filter(source="rubric").values_list(
            "trajectory_id", "name", "value", "step_id", "version"
        )
    )


def pending_ids() -> list[int]:
    return list(datasets.digest_pending_runs().values_list("id", flat=True))


def store_stepless(task_key: str, **fields) -> Trajectory:
    """A finished run with an outcome and no steps at all."""
    record = dataclasses.replace(run_record(task_key, **fields), steps=[])
    trajectory, _ = trajectory_ingest(record=record)
    assert trajectory.n_steps == 0
    return trajectory


def mixed_store() -> tuple[list[Trajectory], list[Trajectory]]:
    """(runs a value build would read, runs it never reads), stored interleaved so that the id order is
    not the order of either group."""
    wanted, unwanted = [], []
    wanted += store_tasks(TASKS[:2], good=1, bad=1)
    unwanted.append(store_run(TASKS[0], status="running", finished_at=None))
    wanted.append(store_run(TASKS[2], success=None, reward=0.75))  # an outcome by reward alone
    unwanted.append(store_run(TASKS[1], status="infra_error"))
    wanted.append(store_run(TASKS[2], good=False, reward=None))  # an outcome by success alone
    unwanted.append(store_run(TASKS[2], status="cancelled", good=False))
    wanted.append(store_run(TASKS[0], duplicate_of=wanted[0]))
    unwanted.append(store_run(TASKS[3], success=None, reward=None))  # no outcome
    wanted.append(store_run(TASKS[1], good=False, curation="rejected"))
    unwanted.append(store_stepless(TASKS[3]))
    wanted.append(store_run(TASKS[3], good=False, status="failed"))
    wanted.append(store_run(TASKS[3], status="imported"))
    return wanted, unwanted


# --- digest_pending_runs ---------------------------------------------------------------------------------


def test_pending_are_the_finished_runs_with_an_outcome_and_steps_oldest_first():
    wanted, unwanted = mixed_store()

    assert pending_ids() == sorted(run.pk for run in wanted)
    assert not set(pending_ids()) & {run.pk for run in unwanted}
    assert all(run.n_steps > 0 for run in wanted)


def test_a_run_with_a_current_digest_is_not_pending_and_one_of_another_version_is():
    runs = store_tasks(TASKS[:2], good=1, bad=1)
    build()  # keeps every run's digest
    assert pending_ids() == []

    TrajectoryDigest.objects.filter(pk=runs[1].pk).update(version="digest-0+old", data=b"not a digest")
    assert pending_ids() == [runs[1].pk]

    TrajectoryDigest.objects.filter(pk=runs[3].pk).delete()
    assert pending_ids() == [runs[1].pk, runs[3].pk]


# --- digests_derive_pending ------------------------------------------------------------------------------


def test_derive_pending_derives_exactly_the_pending_runs_duplicates_and_rejected_included():
    wanted, unwanted = mixed_store()

    derived = datasets.digests_derive_pending()

    assert derived == len(wanted) == 10
    assert set(digest_rows()) == {run.pk for run in wanted}
    assert {version for version, *_ in digest_rows().values()} == {DIGEST_VERSION}
    assert pending_ids() == []
    labelled = {trajectory_id for trajectory_id, *_ in rubric_labels()}
    assert labelled == {run.pk for run in wanted}
    assert not labelled & {run.pk for run in unwanted}
    assert len(rubric_labels()) == len(wanted) * len(LABELS)
    assert {version for *_, version in rubric_labels()} == {RUBRIC_VERSION}

    assert datasets.digests_derive_pending() == 0, "nothing is left"
    assert set(digest_rows()) == {run.pk for run in wanted}


def test_derive_pending_keeps_the_digests_and_labels_a_value_build_keeps():
    runs = store_tasks(TASKS[:3], good=1, bad=2)
    runs.append(store_run(TASKS[0], duplicate_of=runs[0]))
    runs.append(store_run(TASKS[1], good=False, curation="rejected"))
    build(include_duplicates=True, include_rejected=True)  # reads (and keeps) every one of them
    built_digests, built_labels = digest_rows(), rubric_labels()
    assert set(built_digests) == {run.pk for run in runs}
    assert len(built_labels) == len(runs) * len(LABELS)
    assert any(step is not None for _, _, _, step, _ in built_labels), "labels point at steps"
    TrajectoryDigest.objects.all().delete()
    Label.objects.all().delete()
    assert pending_ids() == sorted(run.pk for run in runs)

    derived = datasets.digests_derive_pending()

    assert derived == len(runs)
    assert digest_rows() == built_digests
    assert rubric_labels() == built_labels


def test_derive_pending_replaces_a_digest_of_another_version():
    target, other = store_run(TASKS[0]), store_run(TASKS[1], good=False)
    build()
    before = digest_rows()
    TrajectoryDigest.objects.filter(pk=target.pk).update(version="digest-0+old", data=b"not a digest")

    assert datasets.digests_derive_pending() == 1

    assert digest_rows() == before
    assert RunDigest.decode(bytes(TrajectoryDigest.objects.get(pk=target.pk).data)).decisions
    assert pending_ids() == []
    assert other.pk in digest_rows()


def test_derive_pending_takes_at_most_limit_runs_oldest_first(step_reads):
    runs = store_tasks(TASKS, good=1, bad=1)  # 8 runs, ids ascending
    ids = [run.pk for run in runs]

    assert datasets.digests_derive_pending(limit=3) == 3

    assert set(digest_rows()) == set(ids[:3])
    assert {trajectory_id for trajectory_id, *_ in rubric_labels()} == set(ids[:3])
    assert {i for call in step_reads for i in call} == set(ids[:3]), "only those runs' steps are read"
    assert pending_ids() == ids[3:]
    step_reads.clear()

    assert datasets.digests_derive_pending(limit=4) == 4
    assert set(digest_rows()) == set(ids[:7])
    assert {i for call in step_reads for i in call} == set(ids[3:7])

    assert datasets.digests_derive_pending(limit=4) == 1
    assert datasets.digests_derive_pending(limit=4) == 0
    assert set(digest_rows()) == set(ids)


def test_derive_pending_takes_a_beat_ticks_batch_by_default():
    limit = inspect.signature(datasets.digests_derive_pending).parameters["limit"]

    assert limit.default == datasets.PENDING_DIGESTS > 0


def test_derive_pending_leaves_existing_current_digests_alone():
    first = store_tasks(TASKS[:2], good=1, bad=1)
    build()
    created = {d.pk: d.created_at for d in TrajectoryDigest.objects.all()}
    later = store_tasks(TASKS[2:], good=1, bad=1)

    assert datasets.digests_derive_pending() == len(later)

    assert {
        d.pk: d.created_at for d in TrajectoryDigest.objects.filter(pk__in=[r.pk for r in first])
    } == created
    assert set(digest_rows()) == {run.pk for run in first + later}


def test_after_derive_pending_a_value_build_reads_no_steps_and_matches_a_cold_build(step_reads):
    runs = store_tasks(TASKS, good=1, bad=2)
    store_run(TASKS[0], duplicate_of=runs[0])
    store_run(TASKS[1], status="infra_error")
    assert datasets.digests_derive_pending() == len(runs) + 1
    assert step_reads, "deriving read the steps"
    step_reads.clear()

    warm = build()

    assert step_reads == [], "every run the build used came as its kept digest"
    assert warm.manifest["store"]["steps_read"] == sum(run.n_steps for run in runs)
    warm_labels = rubric_labels()
    TrajectoryDigest.objects.all().delete()
    Label.objects.all().delete()
    cold = build(name="cold")

    assert {i for call in step_reads for i in call} == {run.pk for run in runs}
    same_content(warm, cold)
    assert rubric_labels() == [label for label in warm_labels if label[0] in {run.pk for run in runs}]


def test_derive_pending_after_a_step_change_derives_that_run_again():
    target, other = store_run(TASKS[0]), store_run(TASKS[1])
    datasets.digests_derive_pending()
    before = digest_rows()
    last = Step.objects.filter(trajectory=target).order_by("-seq").first()
    Step.objects.filter(pk=last.pk).update(payload=last.payload | {"output": "1 failed"}, exit_code=1)
    assert pending_ids() == [target.pk], "the trigger dropped the changed run's digest"

    assert datasets.digests_derive_pending() == 1

    after = digest_rows()
    assert after[other.pk] == before[other.pk]
    assert after[target.pk][2] != before[target.pk][2], "the new digest reads the changed steps"


# --- the beat's task ---------------------------------------------------------------------------------------


def test_the_beat_schedules_the_digest_task_every_five_seconds(settings):
    from webapp.celery import app
    from workers.tasks.datasets import digest_pending_batch

    entry = settings.CELERY_BEAT_SCHEDULE["datasets-digest-pending"]

    assert entry["task"] == "trove.datasets.digest_pending" == digest_pending_batch.name
    assert entry["schedule"] == 5.0
    assert "trove.datasets.digest_pending" in app.tasks


def test_the_task_derives_pending_digests_in_this_process():
    from workers.tasks.datasets import digest_pending_batch

    runs = store_tasks(TASKS[:2], good=1, bad=1)

    result = digest_pending_batch.apply().get()  # the registered task, run in this process

    assert result == len(runs)
    assert set(digest_rows()) == {run.pk for run in runs}
    assert digest_pending_batch.apply().get() == 0


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_the_task_derives_pending_digests_in_a_celery_worker(celery_worker_process, step_reads, monkeypatch):
    from workers.tasks.datasets import digest_pending_batch

    monkeypatch.setattr(datasets, "READ_ASIDE", False)  # the build below reads here, where the spy is

    runs = store_tasks(TASKS[:3], good=1, bad=1)
    ids = {run.pk for run in runs}

    digest_pending_batch.delay()

    deadline = time.monotonic() + 60
    while set(digest_rows()) != ids:
        assert time.monotonic() < deadline, f"the worker kept {sorted(digest_rows())}, not {sorted(ids)}"
        time.sleep(0.3)
    assert pending_ids() == []
    assert len(rubric_labels()) == len(runs) * len(LABELS)
    step_reads.clear()
    build(name="after-worker")
    assert step_reads == [], "the build read the worker's digests"


# --- manage.py digest_runs ---------------------------------------------------------------------------------


def test_digest_runs_backfills_every_pending_run_in_batches():
    wanted, unwanted = mixed_store()
    out, err = StringIO(), StringIO()

    call_command("digest_runs", "--batch", "3", stdout=out, stderr=err)

    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert set(summary) == {"version", "pending", "derived", "seconds"}
    assert summary["version"] == DIGEST_VERSION
    assert summary["pending"] == summary["derived"] == len(wanted) == 10
    assert isinstance(summary["seconds"], int | float) and summary["seconds"] >= 0
    assert set(digest_rows()) == {run.pk for run in wanted}
    assert pending_ids() == []
    assert {trajectory_id for trajectory_id, *_ in rubric_labels()} == {run.pk for run in wanted}
    progress = [line for line in err.getvalue().splitlines() if line.startswith("derived")]
    assert progress == ["derived 3 of 10", "derived 6 of 10", "derived 9 of 10", "derived 10 of 10"]

    again = StringIO()
    call_command("digest_runs", "--batch", "3", stdout=again, stderr=StringIO())
    assert json.loads(again.getvalue().strip().splitlines()[-1]) | {"seconds": 0} == {
        "version": DIGEST_VERSION,
        "pending": 0,
        "derived": 0,
        "seconds": 0,
    }


def test_digest_runs_with_the_default_batch_gives_the_same_digests_as_a_build():
    runs = store_tasks(TASKS[:2], good=1, bad=1)
    build()
    built = digest_rows()
    TrajectoryDigest.objects.all().delete()
    out = StringIO()

    call_command("digest_runs", stdout=out, stderr=StringIO())

    assert json.loads(out.getvalue().strip().splitlines()[-1])["derived"] == len(runs)
    assert digest_rows() == built


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_digest_runs_refuses_a_batch_below_one(batch):
    store_run(TASKS[0])

    with pytest.raises(CommandError, match="--batch"):
        call_command("digest_runs", "--batch", batch, stdout=StringIO(), stderr=StringIO())

    assert digest_rows() == {}


def test_runs_that_cannot_be_derived_do_not_starve_the_runs_after_them():
    stuck = [store_run(TASKS[0]), store_run(TASKS[1])]
    Step.objects.filter(trajectory__in=stuck).delete()  # n_steps still says 10: nothing to derive from
    later = [store_run(TASKS[2]), store_run(TASKS[3], good=False)]

    call_command("digest_runs", "--batch", "2", stdout=StringIO(), stderr=StringIO())

    assert {run.pk for run in later} <= set(digest_rows())


def test_a_run_whose_digest_cannot_be_derived_is_recorded_and_the_others_go_on(monkeypatch):
    broken, fine = store_run(TASKS[0]), store_run(TASKS[1])
    real = datasets.derive

    def derive(record, scored=None):
        if record.task_key == TASKS[0]:
            raise ValueError("the detectors choked")
        return real(record, scored)

    monkeypatch.setattr(datasets, "derive", derive)

    assert datasets.digests_derive_pending() == 1
    failed = TrajectoryDigest.objects.get(trajectory=broken)
    assert failed.version == DIGEST_VERSION and failed.error == "ValueError: the detectors choked"
    assert bytes(failed.data) == b"" and TrajectoryDigest.objects.get(trajectory=fine).error == ""
    assert not datasets.digest_pending_runs().exists(), "a failed run is not tried again and again"
    assert datasets.digests_derive_pending() == 0

    monkeypatch.setattr(datasets, "derive", real)
    read: list[list[int]] = []
    real_step_rows = dataset_source._step_rows
    monkeypatch.setattr(dataset_source, "_step_rows", lambda ids: read.append(ids) or real_step_rows(ids))
    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(
            dataset=datasets.dataset_create(name="after", kind="value"), force=True
        ).pk
    )
    assert version.status == "ready"
    assert read == [[broken.pk]], "a build does not read a failed digest: it reads that run's steps"
    assert TrajectoryDigest.objects.get(trajectory=broken).error == "", "and keeps the digest it derives"


# --- batched and per run give the same ----------------------------------------------------------------------


def commented_run(task_key: str, **fields) -> Trajectory:
    """A run whose commands carry shell comments (`# ...`), which the rubric reads past."""
    record = run_record(task_key, **fields)
    steps = [
        dataclasses.replace(step, command=f"{step.command}  # try {n}") if step.kind == "command" else step
        for n, step in enumerate(record.steps)
    ]
    trajectory, _ = trajectory_ingest(record=dataclasses.replace(record, steps=steps))
    return trajectory


def runs_of_every_kind() -> tuple[list[Trajectory], Trajectory]:
    """(runs whose digests can be derived, the run whose digest cannot), the underivable one oldest, so a
    one-run-at-a-time pass meets it first."""
    broken = store_run("choke")
    runs = store_tasks(TASKS[:2], good=1, bad=1)  # tasks of two runs each: their contexts share messages
    runs.append(store_run(TASKS[0], duplicate_of=runs[0]))
    runs.append(store_run(TASKS[1], good=False, curation="rejected"))
    runs.append(commented_run(TASKS[2]))
    runs.append(commented_run(TASKS[3], good=False))
    return runs, broken


def choke_on(monkeypatch, task_key: str) -> None:
    real = datasets.derive

    def derive(record, scored=None):
        if record.task_key == task_key:
            raise ValueError("the detectors choked")
        return real(record, scored)

    monkeypatch.setattr(datasets, "derive", derive)


def test_the_batched_pass_keeps_what_one_run_at_a_time_keeps_and_a_failure_starves_nothing(
    monkeypatch, step_reads
):
    runs, broken = runs_of_every_kind()
    choke_on(monkeypatch, "choke")

    assert datasets.digests_derive_pending() == len(runs)
    assert len(step_reads) == 1, "every run's steps in one read"
    batched_digests, batched_labels = digest_rows(), rubric_labels()
    failed = TrajectoryDigest.objects.get(pk=broken.pk)
    assert failed.error == "ValueError: the detectors choked" and bytes(failed.data) == b""
    TrajectoryDigest.objects.all().delete()
    Label.objects.all().delete()
    step_reads.clear()

    done = [datasets.digests_derive_pending(limit=1) for _ in range(len(runs) + 2)]

    assert done == [0] + [1] * len(runs) + [0], "the failed run first, then every other run, one a call"
    assert step_reads == [[broken.pk]] + [[run.pk] for run in runs]
    assert digest_rows() == batched_digests
    assert rubric_labels() == batched_labels
    assert set(batched_digests) == {run.pk for run in runs} | {broken.pk}
    assert not {trajectory_id for trajectory_id, *_ in batched_labels} & {broken.pk}
    assert pending_ids() == []


def test_digest_runs_goes_past_a_batch_in_which_nothing_could_be_derived(monkeypatch):
    runs, broken = runs_of_every_kind()
    choke_on(monkeypatch, "choke")
    out = StringIO()

    call_command("digest_runs", "--batch", "1", stdout=out, stderr=StringIO())

    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert summary["pending"] == len(runs) + 1 and summary["derived"] == len(runs)
    assert set(digest_rows()) == {run.pk for run in runs} | {broken.pk}
    assert pending_ids() == []


def test_digest_data_is_kept_without_a_second_compression():
    # Already zstd: Postgres's own compression attempt (pglz) would only cost the pass time.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'data'",
            [TrajectoryDigest._meta.db_table],
        )
        assert cursor.fetchone()[0] == "e"
