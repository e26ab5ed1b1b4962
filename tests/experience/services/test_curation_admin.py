"""Curation in the admin: bulk actions over every run matching the list (select across pages), recorded;
the list page in a fixed number of queries."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from experience.models import CurationEvent, Trajectory
from tests.experience.services.store_factories import RunFactory, stored

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/experience/trajectory/"


@pytest.fixture
def admin_client_():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_an_action_over_all_matching_runs_asks_why_then_curates_them_all(admin_client_):
    ids = stored(*[RunFactory(steps=[], model="m-7") for _ in range(150)], RunFactory(steps=[], model="other"))
    across = {"action": "curate_reject", "select_across": "1", "index": "0", "_selected_action": [ids[0]]}

    confirm = admin_client_.post(f"{CHANGELIST}?model__exact=m-7", across)

    assert confirm.status_code == 200
    assert re.search(r"Reject: <strong>150</strong> trajectories \(every one matching", confirm.content.decode())
    assert CurationEvent.objects.count() == 0

    applied = admin_client_.post(f"{CHANGELIST}?model__exact=m-7", {
        "action": "curate_reject", "select_across": "1", "_selected_action": [ids[0]], "apply": "1",
        "reason": "harness bug in batch 7"}, follow=True)

    assert "Reject: 150 of 150 runs changed" in applied.content.decode()
    statuses = dict(Trajectory.objects.values_list("pk", "curation_status"))
    assert [statuses[pk] for pk in ids] == ["rejected"] * 150 + ["pending"]
    assert CurationEvent.objects.filter(action="reject", reason="harness bug in batch 7",
                                        actor__username="root").count() == 150


def test_tagging_the_checked_runs_needs_tags(admin_client_):
    a, b, c = stored(RunFactory(), RunFactory(), RunFactory())
    checked = {"action": "curate_tag", "select_across": "0", "_selected_action": [a, b], "apply": "1"}

    missing = admin_client_.post(CHANGELIST, {**checked, "tags": ""}, follow=True)
    tagged = admin_client_.post(CHANGELIST, {**checked, "tags": "gold, short"}, follow=True)

    assert "tag needs at least one tag" in missing.content.decode()
    assert "Add tags: 2 of 2 runs changed" in tagged.content.decode()
    assert dict(Trajectory.objects.values_list("pk", "tags")) == {a: ["gold", "short"], b: ["gold", "short"], c: []}


def test_the_change_form_cannot_change_curation_behind_the_log(admin_client_):
    (pk,) = stored(RunFactory())

    page = admin_client_.get(f"{CHANGELIST}{pk}/change/").content.decode()

    assert 'name="curation_status"' not in page and 'name="tags"' not in page


def test_the_list_page_costs_the_same_queries_for_10_or_100_runs(admin_client_):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client_.get(CHANGELIST, {"status__exact": "completed"}).status_code == 200
        return len(captured)

    stored(*[RunFactory(steps=[]) for _ in range(10)])
    few = queries()
    stored(*[RunFactory(steps=[]) for _ in range(90)])

    assert queries() == few
