"""Jobs from the browser: start a job from the form, read what it will do on the confirmation, start it, and
cancel it (again confirmed) — the rows change only after each confirmation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.webapp.rollouts.jobs_factories import make_endpoint, make_fleet, make_task_set
from webapp.rollouts.models import Rollout, RolloutJob

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shot(page, name: str) -> None:
    folder = Path(os.environ.get("TROVE_SHOTS", "/tmp/trove-review-shots"))
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)


def test_a_researcher_starts_a_job_from_the_browser_and_cancels_it(logged_in_page, live_server):
    task_set = make_task_set(["fix-1", "fix-2"], name="bugfix")
    fleet = make_fleet(name="pool")
    make_endpoint(name="local-vllm", model_names=["qwen-7b"])
    page = logged_in_page

    page.click("header nav >> text=Jobs")
    page.click("#start-job")
    page.select_option("select[name=task_set]", "bugfix")
    page.select_option("select[name=fleet]", "pool")
    page.select_option("select[name=endpoint]", "local-vllm")
    page.fill("input[name=samples_per_task]", "2")
    page.fill("input[name=max_steps]", "8")
    page.click("#job-start-form button[type=submit]")

    will = page.locator("#confirm-will").inner_text()
    shot(page, "job-start-confirm.png")
    assert "2 task(s) × 2 sample(s) = 4 rollouts" in will and "qwen-7b at endpoint local-vllm" in will
    assert RolloutJob.objects.count() == 0
    page.click("#confirm-button")

    job = RolloutJob.objects.get()
    page.wait_for_url(f"{live_server.url}/jobs/{job.pk}/")
    assert (job.task_set, job.fleet, job.samples_per_task, job.max_steps) == (task_set, fleet, 2, 8)
    assert page.locator("#open-rollouts tbody tr").count() == 4
    shot(page, "job-page-actions.png")

    page.click("#cancel-job-form button[type=submit]")
    assert "cancel its 4 queued and 0 running rollouts" in page.locator("#confirm-will").inner_text()
    page.click("#confirm-button")
    page.wait_for_selector("#messages >> text=cancelled: 4 open rollouts ended")

    job.refresh_from_db()
    assert job.status == RolloutJob.Status.CANCELLED
    assert set(job.rollouts.values_list("status", flat=True)) == {Rollout.Status.CANCELLED}
    page.click("header nav >> text=Jobs")
    assert page.locator(f"#jobs tr[data-job='{job.pk}'] td.status").inner_text() == "cancelled"
    shot(page, "jobs-list.png")


def test_going_back_from_a_confirmation_changes_nothing(logged_in_page, live_server):
    from tests.webapp.rollouts.jobs_factories import make_job

    job = make_job(["a"])
    page = logged_in_page
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.click("#open-rollouts button")
    page.click("#confirm-back")

    page.wait_for_url(f"{live_server.url}/jobs/{job.pk}/")
    assert job.rollouts.get().status == Rollout.Status.QUEUED
