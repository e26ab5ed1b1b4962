"""The run page's RL samples panel and the job page's samples line, rendered by the real views."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.webapp.api.test_job_samples_api import finished_job
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import Rollout

pytestmark = pytest.mark.django_db


@pytest.fixture
def researcher():
    client = Client()
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client.force_login(user)
    return client


def panel(html: str, element_id: str, end: str) -> str:
    match = re.search(rf'id="{element_id}".*?</{end}>', html, re.S)
    assert match, f"no #{element_id} on the page"
    return re.sub(r"\s+", " ", match.group(0))


def test_the_run_page_shows_the_samples_and_each_fork_with_where_and_why(researcher, tokenizer_path):
    job, _ = finished_job(tokenizer_path)
    compacted = Rollout.objects.filter(job=job, task__key="b").first()
    straight = Rollout.objects.filter(job=job, task__key="a").first()

    forked = panel(researcher.get(f"/trajectories/{compacted.trajectory_id}/").content.decode(), "rl-samples", "section")
    assert "4 model calls → <strong>2 samples</strong>" in forked and "exact" in forked
    assert re.search(r'<td>1</td><td><a href="#step-2">2</a></td> <td>compaction</td><td>1</td>', forked)
    one = panel(researcher.get(f"/trajectories/{straight.trajectory_id}/").content.decode(), "rl-samples", "section")
    assert "<strong>1 sample</strong>" in one and "rl-forks" not in one
    # The weights that made the run's calls, as the server named them (finished_job's server: step-<rollout>).
    assert f'policy version <span class="rl-policy">step-{straight.pk}</span>' in one


def test_the_job_page_says_the_share_of_rollouts_that_are_one_sample_and_the_fork_causes(researcher, tokenizer_path):
    job, _ = finished_job(tokenizer_path)
    line = panel(researcher.get(f"/jobs/{job.pk}/").content.decode(), "rl-samples-line", "p")
    assert "<strong>50%</strong> of rollouts are one sample (2 of 4)" in line
    assert "4 exact" in line and "forks: compaction 2." in line


def test_a_run_with_more_calls_than_the_page_assembles_says_so(researcher, tokenizer_path, monkeypatch):
    from webapp.dashboard.templatetags import rl_samples

    monkeypatch.setattr(rl_samples, "RUN_CALLS", 3)
    job, _ = finished_job(tokenizer_path)
    trajectory_id = Rollout.objects.filter(job=job).first().trajectory_id
    text = panel(researcher.get(f"/trajectories/{trajectory_id}/").content.decode(), "rl-samples", "section")
    assert "<strong>no samples</strong>: more than 3 model calls are not assembled on this page" in text
