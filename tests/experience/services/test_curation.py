"""Curation: every change recorded (who, when, what, why), set-based over large selections."""

from __future__ import annotations

import math

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from experience.errors import NotFound, ValidationError
from experience.models import CurationEvent, Trajectory
from experience.search import TrajectoryFilters, trajectory_search
from experience.services.curation import trajectories_curate
from tests.experience.services.store_factories import RunFactory, stored

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator():
    return get_user_model().objects.create_user("curator")


def test_approving_records_who_what_and_why_for_each_run(curator):
    ids = stored(RunFactory(), RunFactory())

    result = trajectories_curate(trajectories=ids, action="approve", actor=curator, reason="clean runs")

    assert (result.matched, result.changed) == (2, 2)
    assert set(Trajectory.objects.values_list("curation_status", flat=True)) == {"approved"}
    events = list(CurationEvent.objects.order_by("trajectory_id"))
    assert [(e.trajectory_id, e.actor, e.action, e.reason) for e in events] == [
        (ids[0], curator, "approve", "clean runs"), (ids[1], curator, "approve", "clean runs")]
    assert [(e.before, e.after) for e in events] == [({"curation_status": "pending"}, {"curation_status": "approved"})] * 2
    assert all(e.created_at for e in events)


def test_an_action_that_changes_nothing_records_nothing(curator):
    ids = stored(RunFactory())
    trajectories_curate(trajectories=ids, action="reject", actor=curator)

    again = trajectories_curate(trajectories=ids, action="reject", actor=curator)

    assert (again.matched, again.changed) == (1, 0)
    assert CurationEvent.objects.count() == 1


def test_tagging_adds_only_missing_tags_and_untagging_removes_them(curator):
    a, b = stored(RunFactory(), RunFactory())
    Trajectory.objects.filter(pk=a).update(tags=["flaky"])

    tagged = trajectories_curate(trajectories=[a, b], action="tag", tags=["flaky", "gold"], actor=curator)
    untagged = trajectories_curate(trajectories=[a, b], action="untag", tags=["flaky"], actor=curator)

    assert (tagged.changed, untagged.changed) == (2, 2)
    assert dict(Trajectory.objects.values_list("pk", "tags")) == {a: ["gold"], b: ["gold"]}
    first = CurationEvent.objects.get(trajectory_id=a, action="tag")
    assert (first.before, first.after) == ({"tags": ["flaky"]}, {"tags": ["flaky", "gold"]})


def test_notes_are_appended(curator):
    (pk,) = stored(RunFactory())

    trajectories_curate(trajectories=[pk], action="note", note="looks off at step 4", actor=curator)
    trajectories_curate(trajectories=[pk], action="note", note="confirmed", actor=curator, reason="rerun")

    assert Trajectory.objects.get(pk=pk).notes == "looks off at step 4\nconfirmed"
    assert CurationEvent.objects.filter(action="note").count() == 2


def test_marking_and_unmarking_a_duplicate(curator):
    canonical, copy = stored(RunFactory(), RunFactory())

    trajectories_curate(trajectories=[copy], action="mark_duplicate", canonical_id=canonical, actor=curator)
    marked = Trajectory.objects.get(pk=copy)
    trajectories_curate(trajectories=[copy], action="unmark_duplicate", actor=curator, reason="different fix")
    unmarked = Trajectory.objects.get(pk=copy)

    assert (marked.is_duplicate, marked.canonical_id) == (True, canonical)
    assert (unmarked.is_duplicate, unmarked.canonical_id) == (False, None)
    event = CurationEvent.objects.get(action="unmark_duplicate")
    assert (event.before, event.after) == ({"is_duplicate": True, "canonical_id": canonical},
                                           {"is_duplicate": False, "canonical_id": None})


@pytest.mark.parametrize(("fields", "field"), [
    ({"action": "bless"}, "action"),
    ({"action": "tag", "tags": []}, "tags"),
    ({"action": "note", "note": "  "}, "note"),
    ({"action": "approve", "canonical_id": 1}, "canonical"),
])
def test_a_bad_request_names_the_field_and_changes_nothing(curator, fields, field):
    ids = stored(RunFactory())

    with pytest.raises(ValidationError) as caught:
        trajectories_curate(trajectories=ids, actor=curator, **fields)

    assert caught.value.field == field
    assert CurationEvent.objects.count() == 0


def test_a_missing_canonical_run_is_not_found(curator):
    ids = stored(RunFactory())

    with pytest.raises(NotFound):
        trajectories_curate(trajectories=ids, action="mark_duplicate", canonical_id=10**9, actor=curator)


def test_a_bulk_action_over_thousands_of_runs_is_a_handful_of_queries(curator, django_assert_max_num_queries):
    stored(*[RunFactory(steps=[], model="m-bulk") for _ in range(3000)])
    selection = trajectory_search(filters=TrajectoryFilters(model="m-bulk"))

    # lock + read, 2 UPDATEs (2,000 ids each), the event INSERTs (2,000 rows each on Postgres; SQLite caps
    # the bound parameters of a statement), savepoint bookkeeping
    per_insert = min(2000, connection.ops.bulk_batch_size(["trajectory", "actor", "action", "before", "after",
                                                           "reason", "created_at"], [None] * 3000))
    with django_assert_max_num_queries(6 + math.ceil(3000 / per_insert)):
        result = trajectories_curate(trajectories=selection, action="approve", actor=curator, reason="batch")

    assert (result.matched, result.changed) == (3000, 3000)
    assert Trajectory.objects.filter(curation_status="approved").count() == 3000
    assert CurationEvent.objects.filter(action="approve", reason="batch").count() == 3000
