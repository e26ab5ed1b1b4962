"""The overview's outcome charts: bars by job and by task, drawn as inline SVG from the real counts."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from experience.models import Trajectory
from tests.experience.services.store_factories import run_record, stored
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.dashboard.charts import outcome_bars
from webapp.rollouts.models import Rollout

R = Rollout.Status


def test_bars_are_scaled_to_the_largest_and_skip_empty_outcomes():
    bars = outcome_bars([("a", "/a", {"succeeded": 3, "failed": 1}), ("b", "/b", {"failed": 2, "cancelled": 0})],
                        width=400)

    assert [(s.outcome, s.x, s.width) for s in bars[0].segments] == [("succeeded", 0.0, 300.0), ("failed", 300.0, 100.0)]
    assert [(s.outcome, s.width) for s in bars[1].segments] == [("failed", 200.0)]
    assert (bars[0].total, bars[1].y) == (4, 22)


@pytest.mark.django_db
def test_the_overview_draws_outcomes_by_job_and_by_task():
    job = make_job(["a", "b", "c"])
    for rollout, status in zip(job.rollouts.order_by("id"), [R.SUCCEEDED, R.FAILED], strict=False):
        finish(rollout.pk, status)
    ids = stored(run_record(task_key="sort-list"), run_record(task_key="sort-list"), run_record(task_key="parse"))
    Trajectory.objects.filter(pk=ids[1]).update(success=False)
    client = Client()
    client.force_login(get_user_model().objects.create_user("reader"))

    page = client.get("/").content.decode()

    jobs_chart = page[page.index('id="chart-jobs"'):page.index('id="chart-tasks"')]
    tasks_chart = page[page.index('id="chart-tasks"'):]
    segments = dict(re.findall(r'data-outcome="(\w+)" data-count="(\d+)"', jobs_chart))
    assert segments == {"succeeded": "1", "failed": "1", "open": "1"}
    sort_list = tasks_chart[tasks_chart.index('data-label="sort-list"'):tasks_chart.index('data-label="parse"')]
    assert re.findall(r'data-outcome="(\w+)" data-count="(\d+)"', sort_list) == [("succeeded", "1"), ("failed", "1")]
    assert 'href="/trajectories/?task=sort-list"' in sort_list
