"""The fleets REST API with a token: templates and their versions, fleets (create, scale, drain, move to a
version, events), sandboxes (filters, detail with events). The agent secret never appears."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.webapp.fleets.fleet_factories import make_fleet, make_template, warm_rows
from webapp.access.roles import role_groups_sync
from webapp.fleets import services
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox

S = Sandbox.State
pytestmark = pytest.mark.django_db
SECRET = "s3cret-agent-value"  # what warm_rows stores as each sandbox's agent secret


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("ops")
    user.groups.add(role_groups_sync()["ops"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_without_a_token_nothing_is_served():
    for url in ("/api/v1/templates/", "/api/v1/fleets/", "/api/v1/sandboxes/"):
        assert APIClient().get(url).status_code == 401


def test_posting_a_template_name_again_makes_its_next_version_from_the_newest_spec(api):
    first = api.post("/api/v1/templates/", {"name": "py", "cpu": 0.5, "setup_commands": ["true"]}, format="json")
    second = api.post("/api/v1/templates/", {"name": "py", "memory_mb": 512}, format="json")

    assert first.status_code == 201 and second.status_code == 201, second.json()
    a, b = first.json(), second.json()
    assert (a["version"], b["version"], b["cpu"], b["memory_mb"], b["setup_commands"]) == (1, 2, 0.5, 512, ["true"])
    assert a["spec_hash"] != b["spec_hash"]
    assert EnvironmentTemplate.objects.get(pk=a["id"]).memory_mb == 1024  # version 1 untouched
    listed = api.get("/api/v1/templates/").json()["results"]
    assert [(t["name"], t["version"]) for t in listed] == [("py", 2), ("py", 1)]


def test_a_bad_template_is_refused_naming_the_field(api):
    response = api.post("/api/v1/templates/", {"name": "x", "network": "everything"}, format="json")
    assert response.status_code == 400 and "network" in response.json()
    assert not EnvironmentTemplate.objects.exists()


def test_a_fleet_is_created_from_a_template_name_and_shows_its_counts(api):
    make_template(name="py")
    newest = services.template_revise(template=EnvironmentTemplate.objects.get(name="py"), cpu=2.0)

    response = api.post("/api/v1/fleets/", {"name": "gpu-less", "template_name": "py", "min_warm": 2, "max_warm": 4,
                                            "max_total": 8, "sizing": "fixed"}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["template"]["id"] == newest.pk and body["template"]["version"] == 2
    assert (body["min_warm"], body["status"], body["counts"]["warm"], body["hit_rate"]) == (2, "active", 0, None)
    assert Fleet.objects.get(name="gpu-less").template == newest


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"name": "f", "template_name": "nope"}, 404, "template"),
    ({"name": "f"}, 400, "template"),
    ({"name": "f", "template_name": "py", "min_warm": 9, "max_warm": 4}, 400, "min_warm"),
])
def test_a_bad_fleet_is_refused_naming_the_field(api, body, status, field):
    make_template(name="py")
    response = api.post("/api/v1/fleets/", body, format="json")
    assert response.status_code == status
    payload = response.json()
    assert payload.get("field") == field or field in payload
    assert not Fleet.objects.exists()


def test_scale_drain_and_move_a_fleet(api):
    fleet = make_fleet(min_warm=1, max_warm=2, max_total=4)
    v2 = services.template_revise(template=fleet.template, pids=64)

    drained = api.post(f"/api/v1/fleets/{fleet.pk}/drain/").json()
    scaled = api.post(f"/api/v1/fleets/{fleet.pk}/scale/", {"max_warm": 6, "max_total": 10}, format="json").json()
    moved = api.post(f"/api/v1/fleets/{fleet.pk}/template/", {"template": v2.pk}, format="json").json()
    refused = api.post(f"/api/v1/fleets/{fleet.pk}/scale/", {"min_warm": 20}, format="json")

    assert drained["status"] == "draining"
    assert (scaled["status"], scaled["max_warm"], scaled["max_total"], scaled["min_warm"]) == ("active", 6, 10, 1)
    assert moved["template"]["id"] == v2.pk
    assert refused.status_code == 400 and refused.json()["field"] == "min_warm"
    events = api.get(f"/api/v1/fleets/{fleet.pk}/events/").json()
    assert [e["kind"] for e in events["results"]] == ["template", "scaled", "drain"]
    assert api.post("/api/v1/fleets/999999/drain/").status_code == 404


def test_the_event_log_pages_back_with_a_cursor(api):
    fleet = make_fleet(max_total=10)
    warm_rows(fleet, 4)  # 3 events each

    first = api.get(f"/api/v1/fleets/{fleet.pk}/events/?limit=5").json()
    second = api.get(f"/api/v1/fleets/{fleet.pk}/events/?limit=5&before={first['next_before']}").json()
    third = api.get(f"/api/v1/fleets/{fleet.pk}/events/?limit=5&before={second['next_before']}").json()

    ids = [e["id"] for e in first["results"] + second["results"] + third["results"]]
    assert len(ids) == 12 and ids == sorted(ids, reverse=True) and len(set(ids)) == 12
    assert third["next_before"] is None


def test_sandboxes_are_listed_with_filters_and_never_show_the_agent_secret(api):
    fleet, other = make_fleet(max_total=10), make_fleet(max_total=10)
    rows = warm_rows(fleet, 3)
    warm_rows(other, 2)
    claimed = services.sandbox_claim_warm(fleet=fleet, holder="rollout:42:w1", lease_seconds=60)

    by_fleet = api.get(f"/api/v1/sandboxes/?fleet={fleet.pk}")
    leased = api.get("/api/v1/sandboxes/?state=leased&holder=rollout:42").json()["results"]
    several = api.get(f"/api/v1/sandboxes/?fleet={fleet.pk}&state=warm,leased").json()["results"]
    bad = api.get("/api/v1/sandboxes/?state=asleep")

    assert [s["id"] for s in by_fleet.json()["results"]] == sorted((s.pk for s in rows), reverse=True)
    assert [s["id"] for s in leased] == [claimed.pk] and leased[0]["fencing_token"] == 1
    assert len(several) == 3 and bad.status_code == 400 and "state" in bad.json()
    assert SECRET not in by_fleet.content.decode() and "agent_secret" not in by_fleet.content.decode()


def test_a_sandbox_detail_has_its_phases_and_events_but_not_its_secret(api):
    fleet = make_fleet()
    warm_rows(fleet, 1)
    sandbox = services.sandbox_claim_warm(fleet=fleet, holder="r", lease_seconds=60)
    services.sandbox_exec_recorded(sandbox=sandbox, command="true", exit_code=0, duration_ms=1.0, first=True)

    response = api.get(f"/api/v1/sandboxes/{sandbox.pk}/")

    body = response.json()
    assert body["state"] == "leased" and body["cold_start_ms"] >= 0 and body["time_to_first_exec_ms"] >= 0
    assert [e["to_state"] for e in body["events"] if e["kind"] == "transition"] == [
        "leased", "warm", "provisioning", "requested"]
    assert SECRET not in response.content.decode()
    assert api.get("/api/v1/sandboxes/999999/").status_code == 404


def test_list_endpoints_use_a_fixed_number_of_queries(api, django_assert_num_queries):
    for _ in range(3):
        warm_rows(make_fleet(max_total=10), 3)
    # token auth (1) + the page (1)
    with django_assert_num_queries(2):
        assert len(api.get("/api/v1/fleets/").json()["results"]) == 3
    with django_assert_num_queries(2):
        assert len(api.get("/api/v1/sandboxes/").json()["results"]) == 9
    with django_assert_num_queries(2):
        assert len(api.get("/api/v1/templates/").json()["results"]) == 3
