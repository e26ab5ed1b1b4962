"""Every way into the compare page the issue names, in Chromium: the explorer's selection, "compare with its
canonical run" on a duplicate, "compare with the most similar run" on the run page (the dedup index's nearest
run of the task), and two ids in the URL (tests/browser/test_run_page.py)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from experience.models import Trajectory
from experience.services.dedup import similar_runs, trajectory_dedup
from tests.experience.importers.fixture_files import DEMOS
from tests.experience.services.test_dedup import MARSHMALLOW, imported

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path("/tmp/trove-run-page-shots")


@pytest.fixture(autouse=True)
def index_dir(settings, tmp_path):
    settings.TROVE_INDEX_DIR = tmp_path / "index"
    settings.TROVE_DEDUP_EMBEDDER = "lexical"


@pytest.fixture
def marshmallow() -> list[int]:
    """Six real SWE-agent runs of one task, deduplicated: near duplicates of each other, one canonical."""
    ids = imported(MARSHMALLOW)
    trajectory_dedup(trajectory_ids=ids)
    return ids


def _compared(page) -> tuple[int, int]:
    page.wait_for_selector("#divergence")
    query = parse_qs(urlparse(page.url).query)
    return int(query["a"][0]), int(query["b"][0])


def test_the_explorer_compares_the_two_checked_runs(logged_in_page, live_server, marshmallow):
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/")
    SHOTS.mkdir(exist_ok=True)
    first, second = marshmallow[1], marshmallow[4]
    page.locator(f'#trajectories input[name="checked"][value="{first}"]').check()
    page.locator("#compare-checked-button").click()
    assert page.locator("#compare-checked-note").inner_text() == "Check exactly two runs to compare them (1 checked)."
    assert "/trajectories/compare/" not in page.url
    page.locator(f'#trajectories input[name="checked"][value="{second}"]').check()
    page.locator("#trajectories").screenshot(path=str(SHOTS / "explorer-checked.png"))
    page.locator("#compare-checked-button").click()
    assert set(_compared(page)) == {first, second}
    shown = {page.locator("#outcome-a a").inner_text(), page.locator("#outcome-b a").inner_text()}
    assert shown == {f"#{first}", f"#{second}"}


def test_a_duplicate_compares_with_its_canonical_run(logged_in_page, live_server, marshmallow):
    duplicate = Trajectory.objects.filter(pk__in=marshmallow, is_duplicate=True).order_by("pk").first()
    assert duplicate is not None and duplicate.canonical_id != duplicate.pk
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{duplicate.pk}/")
    page.locator("#compare-canonical").click()
    assert _compared(page) == (duplicate.pk, duplicate.canonical_id)
    assert page.locator("#outcome-b a").inner_text() == f"#{duplicate.canonical_id}"
    assert page.locator("#counts").inner_text().count("matched") == 1


def test_a_run_compares_with_its_most_similar_run_of_the_task(logged_in_page, live_server, marshmallow):
    run = marshmallow[2]
    (nearest, _score), = similar_runs(trajectory_id=run, k=1, same_task=True)
    page = logged_in_page
    page.goto(f"{live_server.url}/trajectories/{run}/")
    page.locator("#compare-similar").click()
    assert _compared(page) == (run, nearest.pk)
    assert nearest.task_key == Trajectory.objects.get(pk=run).task_key


def test_a_run_alone_in_its_task_is_told_there_is_no_similar_run(logged_in_page, live_server, marshmallow):
    lonely = imported(sorted(DEMOS.glob("human_thought__*/*.traj"))[:1])[0]
    task = Trajectory.objects.get(pk=lonely).task_key
    assert not Trajectory.objects.filter(task_key=task).exclude(pk=lonely).exists()
    page = logged_in_page
    response = page.goto(f"{live_server.url}/trajectories/{lonely}/compare-similar/")
    assert response.status == 404
    assert f"No other run of task {task} is in the similarity index yet" in page.locator(".compare-form").inner_text()
    assert page.locator(".compare-form input[name=a]").input_value() == str(lonely)


def test_the_compare_page_and_its_entry_points_fit_a_390_px_screen(phone_page, live_server, marshmallow):
    page = phone_page
    page.goto(f"{live_server.url}/trajectories/{marshmallow[0]}/")
    page.locator("#compare-similar").scroll_into_view_if_needed()
    assert page.locator("#compare-similar").is_visible()
    page.locator("#compare-with").screenshot(path=str(SHOTS / "compare-with-390.png"))
    page.locator("#compare-similar").click()
    page.wait_for_selector("#divergence")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    page.screenshot(path=str(SHOTS / "compare-390.png"), full_page=False)
    assert overflow <= 1
    assert page.locator("#divergence").is_visible() and page.locator("#outcome-a").is_visible()
