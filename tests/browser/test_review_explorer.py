"""The explorer in a real browser: sort by a column and flip it, read the total, and follow a search result's
snippet to the matching step on the run page; the overview's outcome chart is drawn."""

from __future__ import annotations

import pytest

from experience.models import Trajectory
from tests.browser.test_review_jobs import shot
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_sorted_explorer_with_its_total(logged_in_page, live_server):
    ids = stored(*[run_record(task_key=f"task-{n}") for n in range(3)])
    for pk, reward in zip(ids, [0.2, 0.9, 0.5], strict=True):
        Trajectory.objects.filter(pk=pk).update(reward=reward)
    page = logged_in_page

    page.click("header nav >> text=Trajectories")
    page.click("#trajectories a.sort[data-sort=reward]")
    page.wait_for_url("**sort=-reward**")
    down = page.locator("#trajectories tr[data-id]").evaluate_all("rows => rows.map(r => Number(r.dataset.id))")
    page.click("#trajectories a.sort[data-sort=reward]")
    page.wait_for_url("**sort=reward**")
    up = page.locator("#trajectories tr[data-id]").evaluate_all("rows => rows.map(r => Number(r.dataset.id))")

    assert down == [ids[1], ids[2], ids[0]] and up == [ids[0], ids[2], ids[1]]
    assert page.locator("#total").inner_text() == "3 runs match"
    assert page.locator("#trajectories a.sort[data-sort=reward]").get_attribute("class") == "sort asc"
    page.click("#density")
    assert "compact" in page.locator("#trajectories").get_attribute("class")
    shot(page, "explorer-sorted-compact.png")


def test_a_search_snippet_links_to_its_step_on_the_run_page(logged_in_page, live_server):
    (hit,) = stored(run_record(commands=["ls", "pytest -k flaky_widget_case", "git diff"]))
    stored(run_record(commands=["ls"]))
    page = logged_in_page

    page.goto(f"{live_server.url}/trajectories/")
    page.fill("#filters input[name=q]", "flaky_widget_case")
    page.click("#filters button[type=submit]")
    snippet = page.locator(f"tr.hit[data-hit='{hit}']")
    assert "flaky" in snippet.locator("mark").first.inner_text()
    seq = int(snippet.locator("a.hit-link").inner_text().removeprefix("step "))
    shot(page, "explorer-search-snippet.png")
    snippet.locator("a.hit-link").click()

    page.wait_for_url(f"{live_server.url}/trajectories/{hit}/#step-{seq}**")
    step = page.locator(f"#step-{seq}")
    step.wait_for()
    assert "flaky_widget_case" in step.inner_text()
    shot(page, "run-page-from-snippet.png")


def test_the_overview_draws_the_outcome_chart(logged_in_page, live_server):
    ids = stored(run_record(task_key="sorting"), run_record(task_key="sorting"))
    Trajectory.objects.filter(pk=ids[0]).update(success=False)
    page = logged_in_page

    page.goto(f"{live_server.url}/")

    widths = page.locator("#chart-tasks rect").evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    assert len(widths) == 2 and all(w > 0 for w in widths)
    shot(page, "overview-chart.png")
