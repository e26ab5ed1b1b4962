"""A pairwise queue in a real browser, shared by two curators with the keyboard: one makes it from the pairs
page, both take a pair (never the same one), each types why and presses 1 or 2; each choice is a preference."""

from __future__ import annotations

import pytest

from experience.models import PairwisePreference
from tests.browser.test_review_jobs import shot
from tests.browser.test_review_queue import curator_page, press
from tests.experience.services.store_factories import run_record, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def held_pair(page) -> tuple[int, int]:
    page.locator("#queue-pair").wait_for()
    a, b = page.locator("#queue-pair").get_attribute("data-pair").split(",")
    return int(a), int(b)


def test_two_curators_share_a_pairwise_queue_with_the_keyboard(browser, live_server):
    stored(*[run_record(task_key="sort-list") for _ in range(3)])
    ann, bob = curator_page(browser, live_server, "ann"), curator_page(browser, live_server, "bob")

    ann.goto(f"{live_server.url}/pairs/?task=sort-list")
    ann.fill("#pair-queue-form input[name=name]", "sort-list pairs")
    ann.click("#make-pair-queue")
    ann.wait_for_selector("#messages >> text=3 pairs")
    queue_url = ann.url
    press(ann, "n")
    anns = held_pair(ann)
    bob.goto(queue_url)
    press(bob, "n")
    bobs = held_pair(bob)
    assert set(anns) != set(bobs)

    press(ann, "w")
    ann.keyboard.type("A ran the tests before finishing")
    press(ann, "Enter")  # Enter in the reason chooses nothing
    press(ann, "Escape")
    shot(ann, "pair-queue-ann.png")
    press(ann, "1")
    ann.wait_for_selector(f"#messages >> text=Run {anns[0]} preferred to run {anns[1]}.")
    press(bob, "w")
    bob.keyboard.type("B is shorter")
    press(bob, "Escape")
    press(bob, "2")
    bob.wait_for_selector(f"#messages >> text=Run {bobs[1]} preferred to run {bobs[0]}.")

    assert set(PairwisePreference.objects.values_list("chosen_id", "rejected_id", "actor__username")) == {
        (anns[0], anns[1], "ann"), (bobs[1], bobs[0], "bob")}
    third = held_pair(ann)  # deciding takes the next pair: the one left
    assert len({frozenset(third), frozenset(anns), frozenset(bobs)}) == 3
    assert "2/3" in bob.locator("#queue-progress").inner_text()
