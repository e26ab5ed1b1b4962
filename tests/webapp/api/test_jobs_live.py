"""The job page's live JSON feed: progress, grid, success rate, throughput, ETA and budget per task."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.webapp.rollouts.jobs_factories import drive, finish, make_job
from webapp.dashboard.live import job_live
from webapp.rollouts.models import Rollout, RolloutJob

R = Rollout.Status
pytestmark = pytest.mark.django_db


@pytest.fixture
def researcher(client):
    client.force_login(get_user_model().objects.create_user("researcher"))
    return client


def test_the_snapshot_has_the_grid_the_success_rate_and_the_budget(researcher):
    job = make_job(["b-task", "a-task"], samples_per_task=2)
    a0 = job.rollouts.get(task__key="a-task", sample_index=0)
    finish(a0.pk, R.SUCCEEDED)
    finish(job.rollouts.get(task__key="b-task", sample_index=1).pk, R.FAILED)

    snap = researcher.get(f"/api/v1/jobs/{job.pk}/live/").json()

    assert snap["job"] == {"id": job.pk, "status": "running", "sampling": "uniform", "concurrency": 4, "open": True}
    assert (snap["progress"]["finished"], snap["progress"]["total"], snap["progress"]["success_rate"]) == (2, 4, 0.5)
    assert snap["grid"] == [
        {"task": "a-task", "difficulty": "", "cells": [[0, "succeeded", None], [1, "queued", None]],
         "succeeded": 1, "finished": 1},
        {"task": "b-task", "difficulty": "", "cells": [[0, "queued", None], [1, "failed", None]],
         "succeeded": 0, "finished": 1},
    ]
    assert [(t["task"], t["spent"], t["queued"], t["succeeded"], t["failed"], t["stopped_because"])
            for t in snap["budget"]["per_task"]] == [("a-task", 1, 1, 1, 0, None), ("b-task", 1, 1, 0, 1, None)]
    assert (snap["budget"]["spent"], snap["budget"]["total"]) == (2, 4), "spent: the samples that ran, not those queued"
    assert snap["throughput_per_min"] > 0 and snap["eta_s"] >= 0
    assert snap["trajectory_url"] == "/trajectories/{id}/"


def test_throughput_counts_the_last_few_minutes_and_eta_follows_from_it():
    job = make_job(["a"], samples_per_task=4)
    now = timezone.now()
    RolloutJob.objects.filter(pk=job.pk).update(status="running", started_at=now - timedelta(minutes=30))
    first, second, *_ = job.rollouts.order_by("id")
    Rollout.objects.filter(pk=first.pk).update(status=R.FAILED, finished_at=now - timedelta(minutes=20))
    Rollout.objects.filter(pk=second.pk).update(status=R.SUCCEEDED, finished_at=now - timedelta(minutes=1))

    snap = job_live(job_id=job.pk, now=now)

    assert snap["throughput_per_min"] == 0.2  # one rollout in the last 5 minutes
    assert snap["eta_s"] == 600  # two left at 0.2 a minute


def test_an_ended_job_has_no_eta_and_its_throughput_covers_the_whole_run(researcher):
    job = make_job(["a"], samples_per_task=2)
    drive(job, lambda key, index: R.SUCCEEDED)

    snap = researcher.get(f"/api/v1/jobs/{job.pk}/live/").json()

    assert snap["job"]["open"] is False and snap["eta_s"] is None
    assert snap["progress"]["percent"] == 100 and snap["throughput_per_min"] > 0


def test_the_feed_costs_a_fixed_number_of_queries(researcher, django_assert_num_queries):
    job = make_job([f"t{i}" for i in range(8)], samples_per_task=5)

    with django_assert_num_queries(5):  # session, user, job, rollouts, task keys
        response = researcher.get(f"/api/v1/jobs/{job.pk}/live/")
    assert len(response.json()["grid"]) == 8


def test_the_feed_needs_a_login(client):
    job = make_job(["a"])

    assert client.get(f"/api/v1/jobs/{job.pk}/live/").status_code in (401, 403)


def test_the_job_page_loads_the_live_script_and_points_it_at_the_feed(researcher):
    job = make_job(["a"], sampling="adaptive", samples_per_task=3)

    page = researcher.get(f"/jobs/{job.pk}/").content.decode()

    assert f'data-live-url="/api/v1/jobs/{job.pk}/live/"' in page
    assert "trove/job.js" in page and 'id="budget"' in page and "0/3 finished" in page
