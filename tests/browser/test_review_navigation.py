"""The navigation and the overview in a real browser: every page the review issue added is one click from the
header (jobs, clusters, queues, datasets), and the overview draws outcomes by job and by task, each bar
sized by its counts and linked to the runs behind it."""

from __future__ import annotations

import pytest

from experience.models import Trajectory
from tests.browser.test_review_jobs import shot
from tests.experience.services.store_factories import run_record, stored
from tests.webapp.rollouts.jobs_factories import finish, make_job
from webapp.rollouts.models import Rollout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize(("link", "path", "heading"), [
    ("Jobs", "/jobs/", "Jobs"), ("Clusters", "/clusters/", "Duplicate clusters"),
    ("Queues", "/queues/", "Review queues"), ("Datasets", "/datasets/", "Datasets"),
])
def test_the_header_reaches_each_review_page(logged_in_page, live_server, link, path, heading):
    page = logged_in_page

    page.click(f"header nav >> text={link}")

    page.wait_for_url(f"{live_server.url}{path}")
    assert page.locator("h1").first.inner_text().startswith(heading)


def test_the_overview_draws_outcomes_by_job_and_by_task(logged_in_page, live_server):
    job = make_job(["a", "b"])
    for rollout, status in zip(job.rollouts.order_by("id"), [Rollout.Status.SUCCEEDED, Rollout.Status.FAILED],
                               strict=True):
        finish(rollout.pk, status)
    ids = stored(run_record(task_key="sorting"), run_record(task_key="sorting"), run_record(task_key="parse"))
    Trajectory.objects.filter(pk=ids[0]).update(success=False)
    page = logged_in_page

    page.goto(f"{live_server.url}/")

    def drawn(chart: str) -> dict[str, float]:
        return dict(page.locator(f"#{chart} rect[data-outcome]").evaluate_all(
            "els => els.map(e => [e.dataset.outcome + ':' + e.closest('[data-label]').dataset.label,"
            " e.getBoundingClientRect().width])"))

    jobs, tasks = drawn("chart-jobs"), drawn("chart-tasks")
    shot(page, "overview-jobs-and-tasks.png")
    assert len(jobs) == 2 and all(width > 0 for width in jobs.values())
    assert {key.split(":")[0] for key in jobs} == {"succeeded", "failed"}
    assert tasks["succeeded:sorting"] == pytest.approx(tasks["failed:sorting"])  # one of each
    assert tasks["succeeded:parse"] == pytest.approx(tasks["succeeded:sorting"])
    page.click("#chart-tasks [data-label=parse] a")
    page.wait_for_url("**/trajectories/?task=parse")
    assert page.locator("#trajectories tr[data-id]").count() == 1
