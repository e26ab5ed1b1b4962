"""A running run's counts (steps, model calls, tokens) follow its steps as they are appended, not only once it
finishes: each append adds what it stored, a repeated call or a retried numbered chunk adds nothing, and the
finish's recount finds the same figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from experience.models import Step, Trajectory
from experience.records import StepRecord
from experience.services.ingest import steps_append, trajectory_finish, trajectory_open
from tests.experience.services.store_factories import RunFactory, StepFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _open() -> Trajectory:
    return trajectory_open(rollout_runner=True,
                           record=RunFactory(steps=[], source="rollout", source_ref="rollout:9:attempt:1",
                                             status="running"))


def _call(call_id: str, second: int, tokens_in: int, tokens_out: int) -> StepRecord:
    return StepRecord(kind="model_call", call_id=call_id, started_at=T0 + timedelta(seconds=second),
                      tokens_in=tokens_in, tokens_out=tokens_out, response_text="ls")


def _counts(trajectory: Trajectory) -> tuple[int, int, int, int, int]:
    trajectory.refresh_from_db()
    return (trajectory.n_steps, trajectory.n_model_calls, trajectory.tokens_in, trajectory.tokens_out,
            trajectory.next_seq)


def test_each_append_adds_its_steps_calls_and_tokens_to_the_running_runs_counts():
    trajectory = _open()

    steps_append(trajectory_id=trajectory.pk, steps=[_call("c1", 0, 100, 10)])
    assert _counts(trajectory) == (1, 1, 100, 10, 1)
    steps_append(trajectory_id=trajectory.pk, steps=[StepFactory(started_at=T0 + timedelta(seconds=1)),
                                                     _call("c2", 2, 150, 20)])
    assert _counts(trajectory) == (3, 2, 250, 30, 3)
    # A runner's step that started before a call already stored: renumbered, counted once.
    steps_append(trajectory_id=trajectory.pk, steps=[StepFactory(started_at=T0 + timedelta(milliseconds=500))])
    assert _counts(trajectory) == (4, 2, 250, 30, 4) and trajectory.status == "running"


def test_a_call_sent_again_and_a_retried_numbered_chunk_add_nothing_twice():
    trajectory = _open()
    steps_append(trajectory_id=trajectory.pk, steps=[_call("c1", 0, 100, 10), _call("c2", 1, 50, 5)])

    steps_append(trajectory_id=trajectory.pk, steps=[_call("c2", 1, 50, 5), _call("c3", 2, 70, 7)])
    assert _counts(trajectory) == (3, 3, 220, 22, 3), "c2 once"

    numbered = _open_numbered()
    chunk = [StepFactory(command="a"), StepFactory(command="b")]
    steps_append(trajectory_id=numbered.pk, steps=chunk, first_seq=0)
    steps_append(trajectory_id=numbered.pk, steps=[*chunk, StepFactory(command="c")], first_seq=0)
    assert _counts(numbered) == (3, 0, 0, 0, 3), "the retried chunk's first two steps were stored already"
    steps_append(trajectory_id=numbered.pk, steps=[StepFactory(command="d")], first_seq=3)
    assert list(Step.objects.filter(trajectory=numbered).order_by("seq").values_list("seq", flat=True)) == [0, 1, 2, 3]


def _open_numbered() -> Trajectory:
    return trajectory_open(record=RunFactory(steps=[], source="api", source_ref="client-run-1", status="running"))


def test_the_finish_recount_finds_the_counts_the_appends_kept():
    trajectory = _open()
    steps_append(trajectory_id=trajectory.pk, steps=[_call("c1", 0, 100, 10), StepFactory(started_at=T0 + timedelta(seconds=1))])
    live = _counts(trajectory)

    trajectory_finish(trajectory_id=trajectory.pk, status="completed", reward=1.0, success=True)

    assert _counts(trajectory) == live == (2, 1, 100, 10, 2)
