"""Run digests kept by value builds (TrajectoryDigest): written through by a build that reads a run's
steps, read instead of the steps by the next build, and dropped by triggers (migration 0007) when the
run's steps change. Postgres only."""

from __future__ import annotations

import pytest

from experience.distill.digest import DIGEST_VERSION, RunDigest, derive, instruction_hash
from experience.distill.rubric import LABELS
from experience.distill.values import run_value_rows
from experience.models import DatasetVersion, Label, Step, Trajectory, TrajectoryDigest
from experience.records import StepRecord
from experience.services import dataset_source, datasets
from experience.services.ingest import steps_append, trajectory_ingest
from tests.experience.services.dataset_store import rows_of, run_record, same_content, store_run, store_tasks

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("digests_dataset_dir")]
TASKS = [f"task-{n:02d}" for n in range(4)]


def build(name: str = "set", kind: str = "value", **options) -> DatasetVersion:
    dataset = (
        datasets.dataset_get(ref=name)
        if datasets.dataset_list().filter(name=name).exists()
        else datasets.dataset_create(name=name, kind=kind, options=options)
    )
    version = datasets.dataset_version_request(dataset=dataset, force=True)
    built = datasets.dataset_version_build(version_id=version.pk)
    assert built.status == "ready", built.error
    return built


def kept() -> dict[int, TrajectoryDigest]:
    return {digest.trajectory_id: digest for digest in TrajectoryDigest.objects.all()}


def rubric_labels() -> list[tuple]:
    return sorted(
        Label.objects.filter(source="rubric").values_list(
            "trajectory_id", "name", "value", "step_id", "version"
        )
    )


def test_a_value_build_keeps_one_digest_per_used_run_and_none_for_left_out_runs():
    used = store_tasks(TASKS[:2], good=1, bad=1)
    canonical = used[0]
    duplicate = store_run(TASKS[0], duplicate_of=canonical)
    rejected = store_run(TASKS[0], good=False, curation="rejected")
    unfinished = store_run(TASKS[1], status="infra_error", success=None, reward=None)

    version = build()

    digests = kept()
    assert set(digests) == {run.pk for run in used}
    assert not {duplicate.pk, rejected.pk, unfinished.pk} & set(digests)
    for run in used:
        digest = digests[run.pk]
        steps = list(Step.objects.filter(trajectory=run))
        assert digest.version == DIGEST_VERSION
        assert digest.n_steps == len(steps) == run.n_steps and digest.n_steps in (8, 10)
        assert digest.instruction_sha256 == instruction_hash(run.instruction)
        assert len(digest.steps_sha256) == 64
        decoded = RunDigest.decode(bytes(digest.data))
        assert len(decoded.decisions) == digest.n_steps // 2  # a model call and its command a decision
        # the kept labels are the rubric's, one change per label, with step ids of this run
        assert [name for name, _, _ in digest.labels] == list(LABELS)
        step_ids = {step.pk for step in steps}
        assert all(step is None or step in step_ids for _, _, step in digest.labels)
    assert version.manifest["store"]["runs_read"] == 7


def test_a_kept_digest_is_what_deriving_the_runs_steps_gives():
    run = store_run(TASKS[0])

    build()

    (stored,) = (r for r in dataset_source.source_runs(datasets.spec_for(kind="value")) if r.row_id == run.pk)
    assert RunDigest.decode(bytes(TrajectoryDigest.objects.get(pk=run.pk).data)) == derive(stored.record)
    assert TrajectoryDigest.objects.get(pk=run.pk).steps_sha256 == stored.steps_sha256


def test_a_second_build_reads_the_digests_not_the_steps_and_makes_the_same_files(step_reads):
    runs = store_tasks(TASKS, good=1, bad=2)
    ids = {run.pk for run in runs}

    cold = build()
    cold_reads = {i for call in step_reads for i in call}
    assert cold_reads == ids, "the first build reads every run's steps"
    step_reads.clear()
    created = {pk: digest.created_at for pk, digest in kept().items()}

    warm = build()

    assert step_reads == [], "no step was read: every run came as its digest"
    same_content(cold, warm)
    assert warm.manifest["store"]["steps_read"] == sum(run.n_steps for run in runs)
    assert {pk: digest.created_at for pk, digest in kept().items()} == created, "digests read, not rewritten"

    TrajectoryDigest.objects.all().delete()
    recold = build()

    same_content(cold, recold)
    assert {i for call in step_reads for i in call} == ids
    assert set(kept()) == ids


def test_a_warm_build_writes_the_same_rubric_labels_as_a_cold_one():
    store_tasks(TASKS[:3], good=2, bad=1)
    build()
    cold_labels = rubric_labels()
    assert len(cold_labels) == 9 * len(LABELS)
    assert any(step is not None for _, _, _, step, _ in cold_labels)

    Label.objects.all().delete()
    build()

    assert rubric_labels() == cold_labels


def test_appending_a_step_drops_that_runs_digest_only(step_reads):
    target, other = store_run(TASKS[0]), store_run(TASKS[1], good=False)
    before = build()
    assert set(kept()) == {target.pk, other.pk}

    steps_append(trajectory_id=target.pk, steps=[StepRecord(kind="note", text="a late note")])

    assert set(kept()) == {other.pk}
    step_reads.clear()
    after = build()
    assert [set(call) for call in step_reads] == [{target.pk}], "only the changed run's steps are read"
    assert kept()[target.pk].n_steps == Step.objects.filter(trajectory=target).count() == 11
    assert after.content_hash != before.content_hash


def test_a_raw_step_insert_drops_the_digest():
    target, other = store_run(TASKS[0]), store_run(TASKS[1])
    build()
    last = Step.objects.filter(trajectory=target).order_by("-seq").first()

    Step.objects.create(trajectory=target, seq=last.seq + 1, kind="note", payload={"text": "x"})

    assert set(kept()) == {other.pk}


def test_deleting_a_step_drops_that_runs_digest_only():
    target, other = store_run(TASKS[0]), store_run(TASKS[1])
    build()

    Step.objects.filter(trajectory=target).order_by("-seq").first().delete()

    assert set(kept()) == {other.pk}


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"output": "something else"}},
        {"exit_code": 7},
        {"is_error": True},
        {"tokens_in": 999},
    ],
    ids=lambda change: next(iter(change)),
)
def test_changing_a_step_drops_that_runs_digest_only(change):
    target, other = store_run(TASKS[0]), store_run(TASKS[1])
    build()
    step = Step.objects.filter(trajectory=target, kind="command").order_by("seq").first()

    Step.objects.filter(pk=step.pk).update(**change)

    assert set(kept()) == {other.pk}


def test_writing_value_estimates_keeps_the_digests():
    target = store_run(TASKS[0])
    store_run(TASKS[1])
    build()
    digests = kept()

    updated = Step.objects.filter(trajectory=target).update(value_estimate=0.25)

    assert updated == target.n_steps
    assert kept() == digests
    assert {d.pk: bytes(d.data) for d in kept().values()} == {d.pk: bytes(d.data) for d in digests.values()}


def test_a_step_change_then_a_build_gives_what_a_build_from_scratch_gives():
    store_tasks(TASKS[:2], good=1, bad=1)
    target = Trajectory.objects.order_by("id").first()
    build()
    step = Step.objects.filter(trajectory=target, kind="command").order_by("seq").last()
    Step.objects.filter(pk=step.pk).update(payload=step.payload | {"output": "1 failed"}, exit_code=1)

    warm = build()
    TrajectoryDigest.objects.all().delete()
    cold = build()

    same_content(warm, cold)


def test_a_changed_instruction_makes_the_next_build_derive_the_digest_again(step_reads):
    # No recorded requests: the contexts are rebuilt from the steps, so the task message is the
    # run's instruction as the build reads it.
    record = run_record(TASKS[0])
    for step in record.steps:
        step.request_messages = None
    target, _ = trajectory_ingest(record=record)
    other = store_run(TASKS[1])
    build()
    old_hash = kept()[target.pk].instruction_sha256
    new_instruction = "Make parse() accept surrounding whitespace (reworded)."

    Trajectory.objects.filter(pk=target.pk).update(instruction=new_instruction)
    assert set(kept()) == {target.pk, other.pk}, "no step changed: the digest is still there, stale"
    step_reads.clear()
    warm = build()

    assert [set(call) for call in step_reads] == [{target.pk}], "the stale digest was not used"
    digest = kept()[target.pk]
    assert digest.instruction_sha256 == instruction_hash(new_instruction) != old_hash
    rows = [row for row in rows_of(warm) if int(row["trajectory_id"]) == target.pk]
    tasks = {m["content"] for row in rows for m in row["messages"] if m["role"] == "user"}
    assert new_instruction in tasks and record.instruction not in tasks
    TrajectoryDigest.objects.all().delete()
    same_content(warm, build())


def test_a_digest_of_another_version_is_ignored_and_replaced(step_reads):
    target = store_run(TASKS[0])
    store_run(TASKS[1])
    cold = build()
    TrajectoryDigest.objects.filter(pk=target.pk).update(version="old", data=b"not a digest at all")
    step_reads.clear()

    warm = build()

    assert [set(call) for call in step_reads] == [{target.pk}]
    digest = kept()[target.pk]
    assert digest.version == DIGEST_VERSION
    assert RunDigest.decode(bytes(digest.data)).decisions
    same_content(cold, warm)


def test_a_run_with_lone_surrogates_read_as_its_kept_digest_gives_the_rows_its_steps_give():
    # Read through the read path, not a whole build: the files' writer is not what is tested here.
    record = run_record(TASKS[0])
    for step in record.steps:
        step.request_messages = None  # contexts rebuilt from the steps: the outputs are messages
    command = next(step for step in record.steps if step.kind == "command")
    command.output = "binary \udcff\ud800 output"
    target, _ = trajectory_ingest(record=record)
    spec = datasets.spec_for(kind="value")
    (cold,) = [run for batch in datasets._labelled_batches(spec, dataset_source.Progress()) for run in batch]
    cold_rows = list(run_value_rows(cold, spec))
    assert any("\ud800" in str(m["content"]) for row in cold_rows for m in row["messages"])
    assert target.pk in kept()

    (warm,) = [run for batch in dataset_source.source_run_batches(spec, digests=True) for run in batch]

    assert warm.record.steps == [] and warm.digest is not None
    assert list(run_value_rows(warm, spec)) == cold_rows


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_reader_processes_keep_and_read_digests_the_same():
    runs = store_tasks(TASKS[:3], good=1, bad=1)
    cold = build(name="aside")
    assert set(kept()) == {run.pk for run in runs}, "the reader processes kept every run's digest"
    cold_labels = rubric_labels()
    Label.objects.all().delete()

    warm = build(name="aside")

    same_content(cold, warm)
    assert rubric_labels() == cold_labels
    steps_append(trajectory_id=runs[0].pk, steps=[StepRecord(kind="note", text="late")])
    assert set(kept()) == {run.pk for run in runs[1:]}
