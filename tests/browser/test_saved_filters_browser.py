"""Saved filters in a real browser: a curator filters the explorer, saves it shared under a name, clears the
page, opens the saved filter from the menu (the same runs again), and deletes it."""

from __future__ import annotations

import pytest

from experience.models import SavedFilter
from tests.browser.test_review_jobs import shot
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_save_open_and_delete_a_filter(logged_in_page, live_server):
    wanted = stored(run_record(model="m-wanted"), run_record(model="m-wanted"))
    stored(run_record(model="m-other"))
    page = logged_in_page

    page.goto(f"{live_server.url}/trajectories/")
    page.fill("#filters input[name=model]", "m-wanted")
    page.click("#filters button[type=submit]")
    page.click("#saved-filters summary")
    page.fill("#saved-filters input[name=saved_name]", "wanted model")
    page.check("#saved-filters input[name=shared]")
    page.click("#save-filter")
    page.wait_for_selector("#messages >> text=Saved filter 'wanted model' (shared).")
    saved = SavedFilter.objects.get()
    assert (saved.filters, saved.shared) == ({"model": "m-wanted"}, True)

    page.click("text=Clear")
    assert page.locator("#trajectories tr[data-id]").count() == 3
    assert page.locator("#saved-filters").get_attribute("open") is not None  # unfiltered: the menu opens itself
    shot(page, "explorer-saved-filters.png")
    page.click("#saved-filter-list >> text=wanted model")
    page.wait_for_url("**model=m-wanted**")
    shown = page.locator("#trajectories tr[data-id]").evaluate_all("rows => rows.map(r => Number(r.dataset.id))")
    assert sorted(shown) == sorted(wanted)
    assert page.locator(f"#saved-filter-list li[data-saved-filter='{saved.pk}']").get_attribute("class") == "open"

    page.click("#saved-filters summary")
    page.click("#saved-filter-list button[aria-label='delete saved filter wanted model']")
    page.wait_for_selector("#messages >> text=Saved filter deleted.")
    assert not SavedFilter.objects.exists()
    assert page.locator("#saved-filter-list").text_content().strip().startswith("none yet")
