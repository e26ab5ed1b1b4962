"""The explorer page (search, filters, keyset pages, bulk curation) and the import page, as a browser sees them."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from experience.models import CurationEvent, Trajectory
from tests.experience.importers.fixture_files import MULTI_SWE, PYDICOM
from tests.experience.services.store_factories import RunFactory, run_record, stored
from webapp.access.roles import role_groups_sync

pytestmark = pytest.mark.django_db


@pytest.fixture
def researcher():
    client = Client()
    user = get_user_model().objects.create_user("researcher")
    user.groups.add(role_groups_sync()["researcher"])
    client.force_login(user)
    return client


@pytest.fixture
def curator():
    user = get_user_model().objects.create_user("curator")
    user.groups.add(role_groups_sync()["curator"])
    client = Client()
    client.force_login(user)
    return client


def row_ids(response) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', response.content.decode())]


def test_the_explorer_needs_a_login():
    response = Client().get("/trajectories/")

    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_explorer_filters_and_searches_in_a_fixed_number_of_queries(researcher, django_assert_num_queries):
    hit, _, _ = stored(run_record(model="m-1", commands=["tox -e py311"]), run_record(model="m-1"),
                       run_record(model="m-2", commands=["tox -e py311"]))

    # session, user, permissions x2, the page, the table's size (Postgres: pg_class, for the estimate) and the
    # total, snippets, saved filters
    with django_assert_num_queries(9 if connection.vendor == "postgresql" else 8):
        response = researcher.get("/trajectories/", {"model": "m-1", "q": "tox -e py311"})

    assert response.status_code == 200
    assert row_ids(response) == [hit]
    assert 'value="m-1"' in response.content.decode()


def test_the_explorer_pages_with_a_cursor(researcher):
    ids = stored(*[RunFactory(steps=[]) for _ in range(60)])

    first = researcher.get("/trajectories/")
    next_url = re.search(r'href="([^"]+)" id="next-page"', first.content.decode()).group(1)
    second = researcher.get(next_url.replace("&amp;", "&"))

    assert row_ids(first) == sorted(ids, reverse=True)[:50]
    assert row_ids(second) == sorted(ids, reverse=True)[50:]
    assert 'id="next-page"' not in second.content.decode()


def test_a_bad_filter_shows_the_error(researcher):
    response = researcher.get("/trajectories/", {"created_after": "someday"})

    assert response.status_code == 400
    assert "created_after" in response.content.decode() and row_ids(response) == []


def test_a_curator_approves_the_checked_runs(curator):
    a, b, c = stored(RunFactory(), RunFactory(), RunFactory())

    response = curator.post("/trajectories/curate/", {"checked": [a, c], "selection": "checked", "action": "approve",
                                                      "reason": "verified by hand"}, follow=True)

    assert "approve: 2 of 2 runs changed." in response.content.decode()
    assert dict(Trajectory.objects.values_list("pk", "curation_status")) == {a: "approved", b: "pending",
                                                                             c: "approved"}
    assert set(CurationEvent.objects.values_list("trajectory_id", "reason", "actor__username")) == {
        (a, "verified by hand", "curator"), (c, "verified by hand", "curator")}


def test_a_curator_tags_every_run_matching_the_filters_across_pages(curator):
    ids = stored(*[RunFactory(steps=[], model="m-9") for _ in range(70)], RunFactory(steps=[], model="other"))

    curator.post("/trajectories/curate/", {"model": "m-9", "selection": "matching", "action": "tag",
                                           "curate_tags": "batch-3, gold"})

    tag_lists = dict(Trajectory.objects.values_list("pk", "tags"))
    assert all(tag_lists[pk] == ["batch-3", "gold"] for pk in ids[:70]) and tag_lists[ids[70]] == []
    assert CurationEvent.objects.filter(action="tag").count() == 70


def test_someone_without_the_permission_cannot_curate(researcher):
    (pk,) = stored(RunFactory())

    response = researcher.post("/trajectories/curate/", {"checked": [pk], "selection": "checked", "action": "reject"},
                               follow=True)

    assert response.status_code == 403
    assert "&#x27;trajectories:curate&#x27; needs the role curator" in response.content.decode()
    assert Trajectory.objects.get(pk=pk).curation_status == "pending"


def test_the_import_page_imports_uploads_and_reports_each_file(researcher, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(MULTI_SWE.read_bytes()[:-300])
    with open(PYDICOM, "rb") as good, open(broken, "rb") as bad:
        response = researcher.post("/trajectories/import/", {"file": [good, bad]})

    page = response.content.decode()
    assert response.status_code == 200
    assert "1 run imported, 0 already present." in page
    assert "pydicom__pydicom-1458.traj" in page and "broken.jsonl line 3" in page
    assert list(Trajectory.objects.values_list("source_format", flat=True)) == ["swe-agent-traj"]

    with open(PYDICOM, "rb") as again:
        repeat = researcher.post("/trajectories/import/", {"file": again})

    assert "0 runs imported, 1 already present." in repeat.content.decode()
    assert Trajectory.objects.count() == 1
