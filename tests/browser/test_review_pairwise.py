"""A pairwise choice in a real browser: two runs of one task side by side, "B is better" with a reason; a
pairwise dataset built afterwards holds that pair (chosen B, rejected A) before any automatic one."""

from __future__ import annotations

import pytest

from experience.models import PairwisePreference
from experience.services import datasets
from tests.browser.test_review_jobs import shot
from tests.experience.services.dataset_store import rows_of
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def dataset_dir(settings, tmp_path):
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"


def test_a_pairwise_choice_becomes_a_pair_in_the_dataset(logged_in_page, live_server):
    stored(run_record(task_key="sort-list"), run_record(task_key="sort-list"))
    page = logged_in_page

    page.goto(f"{live_server.url}/trajectories/?task=sort-list")
    page.click("#pairs-link")
    sides = page.locator("#pair .pair-side").evaluate_all("els => els.map(e => Number(e.dataset.run))")
    assert page.locator("#compare-link").get_attribute("href") == f"/trajectories/compare/?a={sides[0]}&b={sides[1]}"
    page.fill("#prefer-form input[name=reason]", "B ran the tests before finishing")
    shot(page, "pairwise.png")
    page.click("#prefer-b")
    page.wait_for_selector(f"#messages >> text=Run {sides[1]} preferred to run {sides[0]}")
    assert page.locator("#no-pairs").is_visible()

    preference = PairwisePreference.objects.get()
    assert (preference.chosen_id, preference.rejected_id) == (sides[1], sides[0])
    dataset = datasets.dataset_create(name="pairs", kind="pairwise")
    version = datasets.dataset_version_build(version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    assert [(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in rows_of(version)] == [
        (str(sides[1]), str(sides[0]))]
