"""Huge integers: `POST /api/v1/templates/` with memory_mb=10**30 was a 500 from the database. Integer input is
bounded by its column's range, a value past it is a 400 naming the field, and the served schema states the
bounds of every integer a client may send (so a new field without them fails here)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from tests.webapp.fleets.fleet_factories import make_fleet
from webapp.access.roles import role_groups_sync
from webapp.api.ranges import INT_MAX
from webapp.fleets.models import EnvironmentTemplate, Fleet

pytestmark = pytest.mark.django_db

TEMPLATE_INTEGERS = ("memory_mb", "pids", "disk_mb", "max_lifetime_s", "idle_timeout_s")


@pytest.fixture
def ops():
    user = get_user_model().objects.create_user("ops")
    user.groups.add(role_groups_sync()["ops"])
    return user


@pytest.fixture
def api(ops):
    client = APIClient()
    client.force_authenticate(ops)
    return client


@pytest.mark.parametrize("field", TEMPLATE_INTEGERS)
def test_a_template_integer_past_its_column_is_a_400_naming_it(api, field):
    huge = api.post("/api/v1/templates/", {"name": "t", field: 10**30}, format="json")
    just_past = api.post("/api/v1/templates/", {"name": "t", field: INT_MAX + 1}, format="json")

    assert (huge.status_code, list(huge.json())) == (400, [field])
    assert (just_past.status_code, list(just_past.json())) == (400, [field])
    assert "less than or equal to 2147483647" in just_past.json()[field][0]
    assert not EnvironmentTemplate.objects.filter(name="t").exists()


def test_the_largest_value_the_column_holds_is_taken(api):
    response = api.post("/api/v1/templates/", {"name": "t", **{f: INT_MAX for f in TEMPLATE_INTEGERS}}, format="json")
    assert response.status_code == 201, response.content
    stored = EnvironmentTemplate.objects.get(name="t")
    assert [getattr(stored, f) for f in TEMPLATE_INTEGERS] == [INT_MAX] * len(TEMPLATE_INTEGERS)


def test_huge_sizes_on_a_fleet_are_refused_by_the_api_and_the_dashboard(api, ops):
    fleet = make_fleet()
    scaled = api.post(f"/api/v1/fleets/{fleet.pk}/scale/", {"max_total": 10**20}, format="json")
    page = Client()
    page.force_login(ops)
    form = page.post(f"/fleets/{fleet.pk}/scale/", {"min_warm": 0, "max_warm": 1, "max_total": 10**20,
                                                   "refill_per_minute": 1}, follow=True)

    assert (scaled.status_code, list(scaled.json())) == (400, ["max_total"])
    assert form.status_code == 200 and "max_total: Ensure this value is less than or equal to" in form.content.decode()
    fleet.refresh_from_db()
    assert fleet.max_total == Fleet._meta.get_field("max_total").default


def test_every_integer_a_client_sends_has_bounds_in_the_schema(api):
    schema = api.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    unbounded = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            for parameter in operation.get("parameters", []):
                unbounded += _unbounded(parameter.get("schema", {}), components, f"{where} ?{parameter['name']}")
            for media in operation.get("requestBody", {}).get("content", {}).values():
                unbounded += _unbounded(media.get("schema", {}), components, f"{where} body")
    assert unbounded == []


def _unbounded(schema: dict[str, Any], components: dict, where: str, seen: frozenset = frozenset()) -> list[str]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return [] if name in seen else _unbounded(components[name], components, where, seen | {name})
    found = []
    if schema.get("type") == "integer" and not schema.get("readOnly"):
        if "minimum" not in schema or "maximum" not in schema:
            found.append(where)
    for name, inner in schema.get("properties", {}).items():
        found += _unbounded(inner, components, f"{where}.{name}", seen)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _unbounded(schema[key], components, f"{where}[]", seen)
    for key in ("allOf", "oneOf", "anyOf"):
        for inner in schema.get(key, []):
            found += _unbounded(inner, components, where, seen)
    return found
