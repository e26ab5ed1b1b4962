"""The jobs pages as a browser posts them: the list with filters, progress and success rate; starting a job,
cancelling a job or a rollout and re-running failed samples, each only after a confirmation naming what it
does; and draining a fleet, confirmed the same way."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.webapp.rollouts.jobs_factories import finish, make_endpoint, make_fleet, make_job, make_task_set
from webapp.access.roles import role_groups_sync
from webapp.fleets.models import Fleet
from webapp.rollouts.models import Rollout, RolloutJob

pytestmark = pytest.mark.django_db
R = Rollout.Status


@pytest.fixture
def researcher():
    client = Client()
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"], role_groups_sync()["ops"])
    client.force_login(user)
    return client


def listed_jobs(response) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job="(\d+)"', response.content.decode())]


def test_the_list_shows_progress_and_success_rate_and_filters_by_status(researcher):
    done = make_job(["a", "b"], samples_per_task=2)
    rollouts = list(done.rollouts.order_by("id"))
    for rollout, status in zip(rollouts, [R.SUCCEEDED, R.SUCCEEDED, R.SUCCEEDED, R.FAILED], strict=True):
        finish(rollout.pk, status)
    running = make_job(["c"])

    page = researcher.get(reverse("dashboard:jobs"))
    completed = researcher.get(reverse("dashboard:jobs"), {"status": "completed"})

    assert listed_jobs(page) == [running.pk, done.pk]
    body = page.content.decode()
    row = body[body.index(f'<tr data-job="{done.pk}"'):]
    assert "4/4" in row[:1200] and '<td class="success-rate">75%</td>' in row[:1200]
    assert listed_jobs(completed) == [done.pk]


def test_a_jobs_page_links_to_its_runs_in_the_explorer(researcher):
    job = make_job(["a"])

    page = researcher.get(reverse("dashboard:job", args=[job.pk])).content.decode()

    assert f'href="/trajectories/?job={job.pk}" id="job-runs"' in page


def test_the_list_pages_by_id_and_filters_by_task_set(researcher):
    jobs = [make_job(["a"]) for _ in range(3)]
    from webapp.dashboard import jobs as job_views

    job_views.JOBS_PAGE, before = 2, job_views.JOBS_PAGE
    try:
        first = researcher.get(reverse("dashboard:jobs"))
        second = researcher.get(re.search(r'href="([^"]+)" id="next-page"', first.content.decode())[1]
                                .replace("&amp;", "&"))
    finally:
        job_views.JOBS_PAGE = before
    by_set = researcher.get(reverse("dashboard:jobs"), {"task_set": jobs[1].task_set.name})

    assert listed_jobs(first) == [jobs[2].pk, jobs[1].pk] and listed_jobs(second) == [jobs[0].pk]
    assert listed_jobs(by_set) == [jobs[1].pk]


def start_fields(task_set, fleet, endpoint, **extra) -> dict:
    return {"task_set": task_set.name, "fleet": fleet.name, "endpoint": endpoint.name, "harness": "builtin",
            "samples_per_task": 3, "sampling": "uniform", "adaptive_first_round": 2, "max_steps": 12,
            "wall_time_s": 300, "concurrency": 2, **extra}


def test_starting_a_job_asks_first_naming_the_runs_the_fleet_and_the_model(researcher):
    task_set, fleet = make_task_set(["a", "b"]), make_fleet(name="pool-a")
    endpoint = make_endpoint(name="vllm-a", model_names=["qwen-7b", "qwen-14b"])
    fields = start_fields(task_set, fleet, endpoint, model_name="qwen-14b")

    asked = researcher.post(reverse("dashboard:job-start"), fields)

    text = asked.content.decode()
    assert asked.status_code == 200 and RolloutJob.objects.count() == 0
    assert "2 task(s) × 3 sample(s) = 6 rollouts" in text and "fleet pool-a" in text
    assert "qwen-14b at endpoint vllm-a (http://127.0.0.1:9/v1)" in text and "at most 12 steps and 300 s" in text

    started = researcher.post(reverse("dashboard:job-start"), {**fields, "confirmed": "yes"})

    job = RolloutJob.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("dashboard:job", args=[job.pk])
    assert (job.model_name, job.endpoint, job.max_steps, job.concurrency, job.rollouts.count()) == (
        "qwen-14b", endpoint, 12, 2, 6)
    assert job.created_by.username == "researcher"


def test_a_bad_start_names_the_problem_and_creates_nothing(researcher):
    task_set, fleet = make_task_set(["a"]), make_fleet()
    endpoint = make_endpoint(model_names=["m1"])

    wrong_model = researcher.post(reverse("dashboard:job-start"),
                                  {**start_fields(task_set, fleet, endpoint, model_name="gpt-x"), "confirmed": "yes"})
    no_endpoint = researcher.post(reverse("dashboard:job-start"),
                                  {**start_fields(task_set, fleet, endpoint), "endpoint": "nope", "confirmed": "yes"})

    assert wrong_model.status_code == 400 and "gpt-x" in wrong_model.content.decode()
    assert no_endpoint.status_code == 400 and "Select a valid choice" in no_endpoint.content.decode()
    assert RolloutJob.objects.count() == 0


def test_cancelling_a_job_asks_with_its_open_counts_then_cancels(researcher):
    job = make_job(["a", "b", "c"])
    first = job.rollouts.order_by("id").first()
    finish(first.pk, R.SUCCEEDED)

    asked = researcher.post(reverse("dashboard:job-cancel", args=[job.pk]))

    assert "cancel its 2 queued and 0 running rollouts" in asked.content.decode()
    assert job.rollouts.filter(status=R.QUEUED).count() == 2
    researcher.post(reverse("dashboard:job-cancel", args=[job.pk]), {"confirmed": "yes"})
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.CANCELLED
    assert sorted(job.rollouts.values_list("status", flat=True)) == [R.CANCELLED, R.CANCELLED, R.SUCCEEDED]


def test_cancelling_one_rollout_from_the_job_page(researcher):
    job = make_job(["a", "b"])
    target = job.rollouts.order_by("id").last()

    page = researcher.get(reverse("dashboard:job", args=[job.pk]))
    asked = researcher.post(reverse("dashboard:rollout-cancel", args=[target.pk]))

    assert f'action="{reverse("dashboard:rollout-cancel", args=[target.pk])}"' in page.content.decode()
    assert f"end rollout {target.pk} (task b, sample 0, now queued) as cancelled" in asked.content.decode()
    researcher.post(reverse("dashboard:rollout-cancel", args=[target.pk]), {"confirmed": "yes"})
    target.refresh_from_db()
    job.refresh_from_db()
    assert target.status == R.CANCELLED and job.status != RolloutJob.Status.CANCELLED


def test_rerunning_failed_samples_names_how_many_then_creates_them(researcher):
    job = make_job(["a", "b", "c"])
    for rollout, status in zip(job.rollouts.order_by("id"), [R.FAILED, R.INFRA_ERROR, R.SUCCEEDED], strict=True):
        finish(rollout.pk, status)

    asked = researcher.post(reverse("dashboard:job-rerun-failed", args=[job.pk]))

    assert "create 2 new rollouts" in asked.content.decode() and job.rollouts.count() == 3
    researcher.post(reverse("dashboard:job-rerun-failed", args=[job.pk]), {"confirmed": "yes"})
    reruns = job.rollouts.filter(rerun_of__isnull=False)
    assert sorted(reruns.values_list("task__key", flat=True)) == ["a", "b"]


def test_draining_a_fleet_asks_first_with_its_sandbox_counts(researcher):
    fleet = make_fleet()

    asked = researcher.post(reverse("dashboard:fleet-drain", args=[fleet.pk]))

    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.ACTIVE
    assert "terminate its 0 warm sandboxes" in asked.content.decode()
    researcher.post(reverse("dashboard:fleet-drain", args=[fleet.pk]), {"confirmed": "yes"})
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.DRAINING


def test_a_curator_may_look_at_jobs_but_not_start_one():
    client = Client()
    user = get_user_model().objects.create_user("cur")
    user.groups.add(role_groups_sync()["curator"])
    client.force_login(user)
    task_set, fleet, endpoint = make_task_set(["a"]), make_fleet(), make_endpoint()

    refused = client.post(reverse("dashboard:job-start"), {**start_fields(task_set, fleet, endpoint), "confirmed": "yes"})

    assert client.get(reverse("dashboard:jobs")).status_code == 200
    assert refused.status_code == 403 and RolloutJob.objects.count() == 0
