"""The job page in Chromium: job.js redraws progress, grid and budget as rollouts finish, without a reload."""

from __future__ import annotations

import shutil

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout

R = Rollout.Status
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WAIT_MS = 15_000


@pytest.fixture
def page(live_server, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes in between are
    # still plain synchronous calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client = Client()
    client.force_login(get_user_model().objects.create_user("watcher"))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium") or None)
        context = browser.new_context()
        context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}])
        yield context.new_page()
        browser.close()


def test_the_job_page_follows_the_job_until_it_ends(page, live_server):
    job = make_job(["alpha", "beta"], samples_per_task=2)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_function("document.querySelectorAll('#budget tbody tr td').length > 1", timeout=WAIT_MS)
    assert page.text_content("#progress") == "0/4 finished (0%)"

    first = job.rollouts.get(task__key="alpha", sample_index=0)
    finish(first.pk, R.SUCCEEDED)
    page.wait_for_function("document.getElementById('progress').textContent.startsWith('1/4')", timeout=WAIT_MS)

    assert page.get_attribute("#grid tbody tr:first-child .cells > :first-child", "class") == "cell cell-succeeded"
    assert page.text_content("#success-rate") == "100%"
    assert "rollouts/min" in page.text_content("#throughput")
    budget_rows = page.locator("#budget tbody tr").all_inner_texts()
    assert budget_rows[0].split("\t")[:5] == ["alpha", "1", "1", "0", "1"]  # spent, queued, running, succeeded
    assert page.text_content("#budget-spent") == "1 of 4 samples"
    assert page.text_content("#running") == "0 of at most 4"

    for rollout in job.rollouts.filter(status=R.QUEUED):
        finish(rollout.pk, R.FAILED)
    page.wait_for_function("document.getElementById('job-status').textContent === 'completed'", timeout=WAIT_MS)
    assert page.text_content("#progress") == "4/4 finished (100%)"
    assert page.text_content("#eta") == "done"
    assert page.text_content("#success-rate") == "25%"
