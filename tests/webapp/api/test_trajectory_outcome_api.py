"""A run's outcome changes through the API only with a reason and a record; its history is readable."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.models import CurationEvent, Trajectory
from tests.experience.services.store_factories import RunFactory, stored
from webapp.access.roles import role_groups_sync
from webapp.access.tokens import token_issue

pytestmark = pytest.mark.django_db


def client_for(user, key: str | None = None) -> APIClient:
    client = APIClient()
    key = key or f"Token {Token.objects.create(user=user).key}"
    client.credentials(HTTP_AUTHORIZATION=key)
    return client


def curator():
    user = get_user_model().objects.create_user("curator")
    user.groups.add(role_groups_sync()["curator"])
    return user


@pytest.fixture
def curator_api() -> APIClient:
    return client_for(curator())


@pytest.fixture
def run_id() -> int:
    (pk,) = stored(RunFactory(reward=1.0, success=True))
    return pk


def outcome(run_id: int) -> tuple:
    return Trajectory.objects.values_list("reward", "success", "status").get(pk=run_id)


def test_an_outcome_edit_records_who_when_before_after_and_why(curator_api, run_id):
    response = curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/",
                                {"reward": 0.0, "success": False, "reason": "the tests it ran were the wrong ones"},
                                format="json")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["trajectory"] == {"id": run_id, "reward": 0.0, "success": False, "status": "completed"}
    assert body["changed"] is True
    event = CurationEvent.objects.get()
    assert (event.trajectory_id, event.action, event.actor.username, event.reason) == (
        run_id, "set_outcome", "curator", "the tests it ran were the wrong ones")
    assert (event.before, event.after) == ({"reward": 1.0, "success": True}, {"reward": 0.0, "success": False})
    assert event.created_at is not None
    assert body["event"]["id"] == event.pk and body["event"]["actor"] == "curator"
    assert outcome(run_id) == (0.0, False, "completed")


@pytest.mark.parametrize("body", [
    {"reward": 0.0},
    {"reward": 0.0, "reason": ""},
    {"reward": 0.0, "reason": "   "},
])
def test_an_outcome_edit_without_a_reason_is_a_400_and_changes_nothing(curator_api, run_id, body):
    response = curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/", body, format="json")

    assert response.status_code == 400, response.json()
    assert "reason" in str(response.json())
    assert outcome(run_id) == (1.0, True, "completed") and CurationEvent.objects.count() == 0


@pytest.mark.parametrize(("body", "field"), [
    ({"reason": "r"}, "reward"),
    ({"reward": "lots", "reason": "r"}, "reward"),
    ({"success": "maybe", "reason": "r"}, "success"),
    ({"status": "running", "reason": "r"}, "status"),
    ({"status": "triumphant", "reason": "r"}, "status"),
])
def test_a_bad_outcome_is_a_400_naming_the_field(curator_api, run_id, body, field):
    response = curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/", body, format="json")

    assert response.status_code == 400, response.json()
    body = response.json()  # a serializer's {field: [problems]} or the service's {"field": field, ...}
    assert field in body or body.get("field") == field
    assert outcome(run_id) == (1.0, True, "completed") and CurationEvent.objects.count() == 0


def test_null_clears_a_field_and_what_is_left_out_stays(curator_api, run_id):
    response = curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/",
                                {"success": None, "status": "failed", "reason": "evaluator crashed"}, format="json")

    assert response.status_code == 200, response.json()
    assert outcome(run_id) == (1.0, None, "failed")
    event = CurationEvent.objects.get()
    assert (event.before, event.after) == ({"success": True, "status": "completed"}, {"success": None, "status": "failed"})


def test_setting_what_the_run_holds_records_nothing(curator_api, run_id):
    response = curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/",
                                {"reward": 1.0, "success": True, "reason": "checked"}, format="json")

    assert response.status_code == 200
    assert (response.json()["changed"], response.json()["event"]) == (False, None)
    assert CurationEvent.objects.count() == 0


def test_a_user_without_the_curation_permission_cannot_change_an_outcome(run_id):
    plain = client_for(get_user_model().objects.create_user("trainer"))

    response = plain.post(f"/api/v1/trajectories/{run_id}/outcome/", {"reward": 0.0, "reason": "r"}, format="json")

    assert response.status_code == 403
    assert outcome(run_id) == (1.0, True, "completed") and CurationEvent.objects.count() == 0


def test_a_scoped_token_needs_the_curate_scope(run_id):
    user = curator()
    reader = client_for(user, f"Bearer {token_issue(user=user, name='r', scopes=['trajectories:read']).key}")
    curating = client_for(user, f"Bearer {token_issue(user=user, name='c', scopes=['trajectories:curate']).key}")
    body = {"reward": 0.5, "reason": "partial credit"}

    refused = reader.post(f"/api/v1/trajectories/{run_id}/outcome/", body, format="json")
    allowed = curating.post(f"/api/v1/trajectories/{run_id}/outcome/", body, format="json")

    assert refused.status_code == 403 and allowed.status_code == 200, (refused.json(), allowed.json())
    assert outcome(run_id)[0] == 0.5 and CurationEvent.objects.count() == 1


def test_an_unknown_run_is_a_404(curator_api):
    changed = curator_api.post("/api/v1/trajectories/999999/outcome/", {"reward": 0.0, "reason": "r"}, format="json")
    history = curator_api.get("/api/v1/trajectories/999999/events/")

    assert (changed.status_code, history.status_code) == (404, 404)
    assert history.json()["detail"] == "trajectory 999999 does not exist"


def test_a_runs_history_lists_every_curation_event_newest_first(curator_api, run_id):
    (other,) = stored(RunFactory())
    curator_api.post("/api/v1/trajectories/curate/", {"ids": [run_id, other], "action": "approve", "reason": "ok"},
                     format="json")
    curator_api.post(f"/api/v1/trajectories/{run_id}/outcome/", {"reward": 0.25, "reason": "rubric score"},
                     format="json")

    page = curator_api.get(f"/api/v1/trajectories/{run_id}/events/", {"limit": 1})
    rest = curator_api.get(page.json()["next"])

    assert page.status_code == 200, page.json()
    events = page.json()["results"] + rest.json()["results"]
    assert [(e["action"], e["actor"], e["reason"]) for e in events] == [
        ("set_outcome", "curator", "rubric score"), ("approve", "curator", "ok")]
    assert (events[0]["before"], events[0]["after"]) == ({"reward": 1.0}, {"reward": 0.25})
    assert {e["trajectory"] for e in events} == {run_id}
    assert rest.json()["next"] is None
