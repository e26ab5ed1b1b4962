"""A review queue in a real browser, worked with the keyboard by two curators at once: one makes it from the
explorer's filters, both take runs (never the same one), label a step, approve and reject with a reason; the
progress line counts what they did."""

from __future__ import annotations

import pytest

from experience.models import Label, ReviewItem, Trajectory
from tests.browser.conftest import CHROMIUM  # noqa: F401 (the browser fixture's settings)
from tests.browser.test_review_jobs import shot
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def curator_page(browser, live_server, name: str):
    from django.contrib.auth import get_user_model

    from webapp.access.roles import role_groups_sync

    user = get_user_model().objects.create_user(username=name, password="s3cret-pass-123")
    user.groups.add(role_groups_sync()["curator"])
    page = browser.new_context().new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", "s3cret-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    return page


def press(page, key: str) -> None:
    """Press `key` once the queue page's keys work (webapp/static/trove/queue.js marks the body): the page
    shows its form before the script that reads the keys has run, and a key pressed before that is lost."""
    page.wait_for_selector("body[data-keys-ready]", state="attached")
    page.keyboard.press(key)


def current_run(page) -> int:
    page.locator("#queue-item").wait_for()
    return int(page.locator("#queue-item").get_attribute("data-trajectory"))


def test_two_curators_work_one_queue_with_the_keyboard(browser, live_server):
    runs = stored(*[run_record(model="m-review") for _ in range(3)], run_record(model="elsewhere"))
    ann, bob = curator_page(browser, live_server, "ann"), curator_page(browser, live_server, "bob")

    ann.goto(f"{live_server.url}/trajectories/?model=m-review")
    ann.fill("#make-queue input[name=name]", "m-review runs")
    ann.click("#make-queue button[type=submit]")
    ann.wait_for_selector("#messages >> text=3 runs")
    queue_url = ann.url
    press(ann, "n")
    first = current_run(ann)

    bob.goto(queue_url)
    press(bob, "n")
    bobs = current_run(bob)
    assert first != bobs and {first, bobs} <= set(runs[:3])

    press(ann, "j")
    press(ann, "j")
    assert ann.locator("#queue-current-step").inner_text() == "2"
    ann.select_option("#queue-label-name", "wrong-tool")
    ann.locator("body").click(position={"x": 5, "y": 5})  # back from the select to the page's keys
    press(ann, "l")
    ann.wait_for_selector("#messages >> text=wrong-tool given to step 2")
    assert ann.locator("#queue-current-step").inner_text() == "2"  # back at the step it labelled
    shot(ann, "queue-ann.png")
    press(ann, "a")
    ann.wait_for_selector(f"#messages >> text=Run {first}: approve")
    third = current_run(ann)

    press(bob, "r")
    bob.keyboard.type("the patch deletes the failing test")
    press(bob, "Enter")
    bob.wait_for_selector(f"#messages >> text=Run {bobs}: reject")
    shot(bob, "queue-bob.png")

    assert third not in (first, bobs)
    assert Trajectory.objects.get(pk=first).curation_status == "approved"
    assert Trajectory.objects.get(pk=bobs).curation_status == "rejected"
    assert Label.objects.get(source="human").trajectory_id == first
    assert "2/3" in bob.locator("#queue-progress").inner_text()
    assert set(ReviewItem.objects.exclude(decision="").values_list("decided_by__username", flat=True)) == {"ann", "bob"}
