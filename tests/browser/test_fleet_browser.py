"""The fleet pages in a real browser: create a fleet from the form, read its counts and histograms, scale it,
move it to a new template version and drain it (both confirmed first), and page through its event log."""

from __future__ import annotations

import pytest

from tests.webapp.fleets.fleet_factories import make_fleet, make_template, warm_rows
from webapp.fleets import services
from webapp.fleets.models import Fleet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_creates_scales_moves_and_drains_a_fleet(logged_in_page, live_server):
    template = make_template(name="python-sandbox")
    v2 = services.template_revise(template=template, pids=128)
    page = logged_in_page

    page.click("header nav >> text=Fleets")
    page.fill("#create-fleet input[name=name]", "bugfix-pool")
    page.select_option("#create-fleet select[name=template]", str(template.pk))
    page.fill("#create-fleet input[name=min_warm]", "1")
    page.fill("#create-fleet input[name=max_warm]", "3")
    page.fill("#create-fleet input[name=max_total]", "6")
    page.select_option("#create-fleet select[name=sizing]", "fixed")
    page.click("#create-fleet button[type=submit]")

    fleet = Fleet.objects.get(name="bugfix-pool")
    page.wait_for_url(f"{live_server.url}/fleets/{fleet.pk}/")
    assert "Fleet bugfix-pool created." in page.locator("#messages").inner_text()
    assert page.locator("#fleet-status").inner_text() == "active"

    page.fill("#scale-form input[name=max_warm]", "4")
    page.fill("#scale-form input[name=max_total]", "10")
    page.click("#scale-form button[type=submit]")
    page.wait_for_selector("#messages >> text=scaled")
    page.select_option("#template-form select[name=template]", str(v2.pk))
    page.click("#template-form button[type=submit]")
    assert "from python-sandbox v2 (now python-sandbox v1)" in page.locator("#confirm-will").inner_text()
    page.click("#confirm-button")
    page.wait_for_selector("#messages >> text=moves to python-sandbox v2")
    page.click("#drain-form button[type=submit]")
    assert "terminate its 0 warm sandboxes" in page.locator("#confirm-will").inner_text()
    page.click("#confirm-button")
    page.wait_for_selector("#hold >> text=Draining")

    fleet.refresh_from_db()
    assert (fleet.max_warm, fleet.max_total, fleet.template, fleet.status) == (4, 10, v2, Fleet.Status.DRAINING)
    kinds = page.locator("#events td.kind").all_inner_texts()
    assert kinds[:3] == ["drain", "template", "scaled"]


def test_the_fleet_page_draws_its_histograms_and_pages_its_log(logged_in_page, live_server):
    fleet = make_fleet(name="busy", max_warm=40, max_total=40)
    warm_rows(fleet, 20)  # 60 events: more than one page
    for _ in range(5):
        services.sandbox_claim_warm(fleet=fleet, holder="rollout", lease_seconds=60, started=0.0)
    page = logged_in_page

    page.goto(f"{live_server.url}/fleets/{fleet.pk}/")

    assert page.locator("#counts [data-state=warm] strong").inner_text() == "15"
    assert page.locator("#counts [data-state=leased] strong").inner_text() == "5"
    assert page.locator("#hist-cold_start .bar-row").count() >= 1
    assert page.locator("#hist-claim .bar-row").count() >= 1
    assert "No data yet." in page.locator("#hist-first_exec").inner_text()
    widths = page.locator("#hist-claim .fill").evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    assert max(widths) > 0
    first_page = page.locator("#events tbody tr").count()
    page.click("#older")
    assert first_page == 50 and page.locator("#events tbody tr").count() == 15
