"""The explorer's review additions: sortable columns, the total (exact, estimated on a large store), compact
rows, and search results with a snippet of the first matching step linking to it; the query grammar the
embedded store reads (`or`, phrases, prefixes) and the snippet's escaping."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from experience.models import Trajectory
from experience.search_hits import MARK_END, MARK_START, Term, query_groups, snippet_around, trajectory_total
from tests.experience.services.store_factories import run_record, stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader():
    client = Client()
    client.force_login(get_user_model().objects.create_user("reader"))
    return client


def row_ids(response) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', response.content.decode())]


def test_columns_sort_both_ways_and_page_by_offset(reader):
    ids = stored(*[run_record(task_key=f"t{n}") for n in range(3)])
    for pk, reward in zip(ids, [0.5, 0.9, 0.1], strict=True):
        Trajectory.objects.filter(pk=pk).update(reward=reward)
    unrewarded = stored(run_record(task_key="none"))[0]
    Trajectory.objects.filter(pk=unrewarded).update(reward=None)

    down = reader.get(reverse("dashboard:explorer"), {"sort": "-reward"})
    up = reader.get(reverse("dashboard:explorer"), {"sort": "reward"})

    assert row_ids(down) == [ids[1], ids[0], ids[2], unrewarded]  # no reward last, either way
    assert row_ids(up) == [ids[2], ids[0], ids[1], unrewarded]
    header = re.search(r'<a class="sort desc" data-sort="reward" href="([^"]+)"', down.content.decode())
    assert header and "sort=reward" in header[1]  # a second click flips it

    from webapp.dashboard import explorer

    explorer.PAGE, before = 2, explorer.PAGE
    try:
        first = reader.get(reverse("dashboard:explorer"), {"sort": "-reward"})
        nxt = re.search(r'href="([^"]+)" id="next-page"', first.content.decode())[1].replace("&amp;", "&")
        second = reader.get(nxt)
    finally:
        explorer.PAGE = before
    assert row_ids(first) + row_ids(second) == row_ids(down)


def test_an_unknown_sort_falls_back_to_newest_first(reader):
    ids = stored(run_record(), run_record())

    assert row_ids(reader.get(reverse("dashboard:explorer"), {"sort": "password"})) == ids[::-1]


def test_the_page_shows_the_total_of_every_match_not_of_the_page(reader):
    stored(*[run_record(task_key="many") for _ in range(3)], run_record(task_key="other"))
    from webapp.dashboard import explorer

    explorer.PAGE, before = 2, explorer.PAGE
    try:
        page = reader.get(reverse("dashboard:explorer"), {"task": "many"})
    finally:
        explorer.PAGE = before
    assert len(row_ids(page)) == 2
    assert re.search(r'<span id="total">3 runs match</span>', page.content.decode())


def test_past_the_threshold_the_total_is_the_planners_estimate():
    stored(*[run_record(task_key="est") for _ in range(4)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE experience_trajectory")

    exact = trajectory_total(Trajectory.objects.filter(task_key="est"))
    estimate = trajectory_total(Trajectory.objects.filter(task_key="est"), estimate_above=1)

    assert (exact.count, exact.estimated) == (4, False)
    assert estimate.estimated and 1 <= estimate.count <= 10


def test_compact_rows_are_a_link_that_keeps_the_filters(reader):
    stored(run_record(task_key="x"))

    page = reader.get(reverse("dashboard:explorer"), {"task": "x", "density": "compact"}).content.decode()

    assert 'class="grid compact" id="trajectories"' in page
    link = re.search(r'href="([^"]+)" id="density">comfortable rows', page)[1]
    assert "task=x" in link and "density" not in link


def test_a_search_result_shows_its_first_matching_step_and_links_to_it(reader):
    (hit,) = stored(run_record(commands=["ls", "grep -rn needle_token src/", "cat x"]))
    stored(run_record(commands=["ls"]))

    page = reader.get(reverse("dashboard:explorer"), {"q": "needle_token"}).content.decode()

    assert row_ids_in(page) == [hit]
    link = re.search(r'<a class="hit-link" href="([^"]+)">step (\d+)</a> <span class="snippet">(.*?)</span>', page, re.S)
    seq = int(link[2])
    assert link[1] == f"/trajectories/{hit}/#step-{seq}&amp;q=needle_token"
    assert "<mark>needle</mark>_<mark>token</mark>" in link[3]  # the search's own tokens, marked
    from experience.models import Step

    assert "needle_token" in (Step.objects.get(trajectory_id=hit, seq=seq).preview + str(
        Step.objects.get(trajectory_id=hit, seq=seq).payload))
    assert not Step.objects.filter(trajectory_id=hit, seq__lt=seq, preview__contains="needle_token").exists()


def row_ids_in(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', page)]


def test_or_and_phrases_find_either_run(reader):
    one, two, _ = stored(run_record(commands=["make alpha_build"]), run_record(commands=["run beta_check now"]),
                         run_record(commands=["ls"]))

    either = reader.get(reverse("dashboard:explorer"), {"q": "alpha_build or \"beta_check now\""})

    assert sorted(row_ids(either)) == [one, two]


def test_step_text_in_a_snippet_is_escaped_before_the_marks_become_html(reader):
    stored(run_record(commands=["printf evil_marker '<script>alert(1)</script>'"]))

    page = reader.get(reverse("dashboard:explorer"), {"q": "evil_marker"}).content.decode()

    snippet = re.search(r'<span class="snippet">(.*?)</span>', page, re.S)[1]
    assert "<script>alert" not in page and "<mark>evil</mark>_<mark>marker</mark>" in snippet


def test_the_marked_filter_escapes_the_text_and_only_then_marks_it():
    from webapp.dashboard.templatetags.review import marked

    html = marked(f"<img src=x onerror=alert(1)> {MARK_START}hit{MARK_END} </mark><script>")

    assert html == "&lt;img src=x onerror=alert(1)&gt; <mark>hit</mark> &lt;/mark&gt;&lt;script&gt;"


def test_the_embedded_grammar_reads_or_phrases_and_prefixes():
    assert query_groups('pytest "no module named" or pip* -rn') == [
        [Term("pytest"), Term("no module named", phrase=True)], [Term("pip", prefix=True), Term("-rn")]]
    assert query_groups("or or") == []


def test_a_snippet_marks_every_term_around_the_first_match_and_drops_smuggled_marks():
    text = "x" * 300 + f" found {MARK_START}the Needle{MARK_END} here, and needle again " + "y" * 300

    snippet = snippet_around(text, ["needle"], width=20)

    assert snippet.startswith("… ") and snippet.endswith(" …")
    assert snippet.count(MARK_START) == 2 and f"{MARK_START}Needle{MARK_END}" in snippet
