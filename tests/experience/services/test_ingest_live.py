"""The live path (trajectory_open, steps_append, trajectory_finish) as a rollout uses it: the proxy's model
calls and the runner's own steps reach the same run from two writers, out of time order; the stored run
still reads in time order with contiguous step numbers, and finishing it counts what is stored."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from experience.models import Step, Trajectory
from experience.records import StepRecord
from experience.services.ingest import (
    steps_append,
    trajectory_finish,
    trajectory_ingest,
    trajectory_open,
    trajectory_tally,
)
from tests.experience.services.store_factories import RunFactory, run_record

pytestmark = pytest.mark.django_db


def _open(ref: str = "rollout:1:attempt:1") -> Trajectory:
    return trajectory_open(rollout_runner=True,
                           record=RunFactory(steps=[], source="rollout", source_ref=ref, status="running"))


def _stored(trajectory: Trajectory) -> list[tuple[int, str | None, str]]:
    return list(Step.objects.filter(trajectory=trajectory).order_by("seq").values_list("seq", "call_id", "kind"))


def test_the_runners_steps_written_after_the_proxys_calls_are_stored_in_time_order():
    run = run_record(calls=4)  # model_call, command, model_call, command, ... one second apart
    calls = [s for s in run.steps if s.kind == "model_call"]
    commands = [s for s in run.steps if s.kind == "command"]
    trajectory = _open()

    steps_append(trajectory_id=trajectory.pk, steps=calls[:2])  # the proxy stores calls as they come
    steps_append(trajectory_id=trajectory.pk, steps=commands[:1])  # a runner batch older than call 1
    steps_append(trajectory_id=trajectory.pk, steps=calls[2:])
    steps_append(trajectory_id=trajectory.pk, steps=commands[1:])  # the runner's last batch, at the end

    stored = _stored(trajectory)
    assert [kind for _, _, kind in stored] == [s.kind for s in run.steps]
    assert [call_id for _, call_id, _ in stored] == [s.call_id for s in run.steps]
    assert [seq for seq, _, _ in stored] == list(range(len(run.steps)))
    trajectory.refresh_from_db()
    assert trajectory.next_seq == len(run.steps) and trajectory.search_indexed is False


def test_steps_without_a_start_time_go_after_the_timed_ones_in_the_order_they_came():
    run = run_record(calls=2)
    trajectory = _open()
    untimed = [StepRecord(kind="note", text="first untimed"), StepRecord(kind="note", text="second untimed")]

    steps_append(trajectory_id=trajectory.pk, steps=[run.steps[2], untimed[0]])
    steps_append(trajectory_id=trajectory.pk, steps=[run.steps[0], untimed[1]])

    kinds_and_calls = [(kind, call_id) for _, call_id, kind in _stored(trajectory)]
    assert kinds_and_calls == [("model_call", "call-0"), ("model_call", "call-1"), ("note", None), ("note", None)]
    texts = list(Step.objects.filter(trajectory=trajectory, kind="note").order_by("seq").values_list("preview", flat=True))
    assert [t.startswith(("first", "second")) for t in texts] == [True, True] and texts[0].startswith("first")


def test_a_redelivered_batch_adds_nothing_and_leaves_the_run_as_it_was():
    run = run_record(calls=2)
    trajectory = _open()
    steps_append(trajectory_id=trajectory.pk, steps=run.steps)
    Trajectory.objects.filter(pk=trajectory.pk).update(search_indexed=True)  # the indexer has caught up

    again = steps_append(trajectory_id=trajectory.pk, steps=[s for s in run.steps if s.call_id])
    partly = steps_append(trajectory_id=trajectory.pk, steps=[run.steps[0], replace(run.steps[2], call_id="new")])

    assert again == [] and len(partly) == 1
    trajectory.refresh_from_db()
    assert trajectory.next_seq == len(run.steps) + 1 == Step.objects.filter(trajectory=trajectory).count()
    assert [seq for seq, _, _ in _stored(trajectory)] == list(range(len(run.steps) + 1))


def test_a_batch_of_calls_already_stored_does_not_send_the_run_back_to_the_search_indexer():
    run = run_record(calls=1)
    trajectory = _open()
    steps_append(trajectory_id=trajectory.pk, steps=run.steps)
    Trajectory.objects.filter(pk=trajectory.pk).update(search_indexed=True)

    steps_append(trajectory_id=trajectory.pk, steps=[run.steps[0]])

    assert Trajectory.objects.get(pk=trajectory.pk).search_indexed is True


def test_an_append_in_time_order_is_four_queries_at_most():
    run = run_record(calls=2)
    trajectory = _open()
    steps_append(trajectory_id=trajectory.pk, steps=run.steps[:2])

    with CaptureQueriesContext(connection) as captured:
        steps_append(trajectory_id=trajectory.pk, steps=run.steps[2:3])

    # the blob check, the numbers reserved under the row lock, the call-id / later-step check, the insert
    statements = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) <= 4, statements


def test_finishing_counts_the_stored_steps_and_hashes_them_as_a_whole_run_would_be():
    run = run_record(calls=3)
    trajectory = trajectory_open(record=replace(run, steps=[], source_ref="live", status="running"))
    steps_append(trajectory_id=trajectory.pk, steps=[s for s in run.steps if s.kind == "model_call"])
    steps_append(trajectory_id=trajectory.pk, steps=[s for s in run.steps if s.kind == "command"])

    finished = trajectory_finish(trajectory_id=trajectory.pk, status="completed", reward=1.0, success=True,
                                 finished_at=run.finished_at)

    whole, _ = trajectory_ingest(record=replace(run, source_ref="the-same-run-in-bulk"))
    finished.refresh_from_db()
    assert (finished.n_steps, finished.n_model_calls, finished.tokens_in, finished.tokens_out) == (
        whole.n_steps, whole.n_model_calls, whole.tokens_in, whole.tokens_out) == (6, 3, 330, 60)
    assert finished.content_hash == whole.content_hash
    assert finished.status == "completed" and finished.duration_s == whole.duration_s


def test_opening_the_same_run_twice_returns_it_also_inside_a_transaction():
    first = _open("rollout:7:attempt:1")
    with transaction.atomic():
        again = _open("rollout:7:attempt:1")
        other = _open("rollout:7:attempt:2")  # the transaction is still usable after the lost insert

    assert again.pk == first.pk and other.pk != first.pk
    assert Trajectory.objects.filter(source_ref__startswith="rollout:7:").count() == 2


def _finished_counts(trajectory_id: int) -> tuple:
    t = Trajectory.objects.get(pk=trajectory_id)
    return t.status, t.n_steps, t.n_model_calls, t.tokens_in, t.tokens_out, t.content_hash, t.duration_s


def test_a_finish_with_a_tally_taken_before_the_last_non_action_step_matches_a_recount():
    run = run_record(calls=3)
    trajectory = trajectory_open(record=replace(run, steps=[], source_ref="tallied", status="running"))
    steps_append(trajectory_id=trajectory.pk, steps=run.steps)
    tally = trajectory_tally(trajectory_id=trajectory.pk)  # e.g. while the evaluation runs
    evaluation = StepRecord(kind="eval", command="pytest", output="3 passed", exit_code=0)
    steps_append(trajectory_id=trajectory.pk, steps=[evaluation])

    assert trajectory_finish(trajectory_id=trajectory.pk, status="completed", reward=1.0,
                             finished_at=run.finished_at, tally=tally.with_steps([evaluation])) is None
    with_tally = _finished_counts(trajectory.pk)
    trajectory_finish(trajectory_id=trajectory.pk, status="completed", reward=1.0, finished_at=run.finished_at)

    assert with_tally == _finished_counts(trajectory.pk)
    assert with_tally[1:5] == (7, 3, 330, 60)


def test_a_tally_overtaken_by_steps_it_was_not_told_about_is_not_used():
    run = run_record(calls=3)
    trajectory = trajectory_open(record=replace(run, steps=[], source_ref="overtaken", status="running"))
    steps_append(trajectory_id=trajectory.pk, steps=run.steps[:4])
    tally = trajectory_tally(trajectory_id=trajectory.pk)
    steps_append(trajectory_id=trajectory.pk, steps=run.steps[4:])  # a late call and command: actions

    assert tally.with_steps(run.steps[4:]) is None  # actions change the hash: only a recount will do
    finished = trajectory_finish(trajectory_id=trajectory.pk, status="completed", tally=tally)

    assert finished is not None  # recounted
    assert (finished.n_steps, finished.n_model_calls, finished.tokens_in) == (6, 3, 330)
