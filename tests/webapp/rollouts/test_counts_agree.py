"""Every place that shows a job's counts shows the same ones, and "budget spent" is what was issued to a
worker. The same against a live job on the full stack: tests/integration/test_live_counts.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from experience.records import StepRecord, TrajectoryRecord
from experience.services.ingest import steps_append, trajectory_open
from tests.webapp.rollouts.job_views import job_disagreements, job_rows, run_views
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import rollout_cancel, rollout_start

pytestmark = pytest.mark.django_db
R = Rollout.Status


def test_a_job_nothing_of_which_has_run_has_spent_nothing_and_no_task_has_stopped(admin_client):
    job = make_job(["a", "b", "c"], samples_per_task=4)

    body = admin_client.get(f"/api/v1/jobs/{job.pk}/").json()
    page = admin_client.get(f"/jobs/{job.pk}/").content.decode()

    assert (body["budget"]["spent"], body["budget"]["created"], body["budget"]["total"]) == (0, 12, 12)
    assert {(row["stopped"], row["stopped_because"]) for row in body["budget"]["per_task"]} == {(False, None)}
    assert 'id="budget-spent">0 of 12 samples' in page and "all its samples issued" not in page
    assert 'id="running">0 of at most 4<' in page
    assert job_disagreements(admin_client, job) == []


def test_every_view_of_a_job_in_every_state_shows_the_same_counts(admin_client):
    job = make_job(["a", "b", "c"], samples_per_task=3, concurrency=3)
    rollouts = list(job.rollouts.order_by("sample_index", "id"))
    finish(rollouts[0].pk, R.SUCCEEDED)
    finish(rollouts[1].pk, R.FAILED)
    assert rollout_start(rollout_id=rollouts[2].pk, worker="w") is not None
    assert rollout_start(rollout_id=rollouts[3].pk, worker="w") is not None
    rollout_cancel(rollout=rollouts[4])  # cancelled before it ran: no budget spent on it

    truth = job_rows(job)

    assert (truth["finished"], truth["running"], truth["queued"], truth["spent"]) == (3, 2, 4, 4)
    assert job_disagreements(admin_client, job) == []


def test_a_running_runs_counts_follow_its_steps_on_its_page_and_in_the_api(admin_client):
    job = make_job(["a"])
    rollout = job.rollouts.get()
    trajectory = trajectory_open(rollout_runner=True, record=TrajectoryRecord(
        source="rollout", source_format="trove-rollout", task_key="a", source_ref=f"rollout:{rollout.pk}:attempt:1",
        status="running"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    steps_append(trajectory_id=trajectory.pk, steps=[
        StepRecord(kind="model_call", started_at=t0, call_id="c1", tokens_in=10, tokens_out=3, text="ls"),
        StepRecord(kind="command", started_at=t0 + timedelta(seconds=1), command="ls", output="a.py", exit_code=0),
    ])
    steps_append(trajectory_id=trajectory.pk, steps=[
        StepRecord(kind="model_call", started_at=t0 + timedelta(seconds=2), call_id="c2", tokens_in=20, tokens_out=4),
    ])

    views = run_views(admin_client, trajectory.pk)

    assert all(counts == {"steps": 3, "model_calls": 2} for counts in views.values()), views
    trajectory.refresh_from_db()
    assert (trajectory.status, trajectory.tokens_in, trajectory.tokens_out) == ("running", 30, 7)
