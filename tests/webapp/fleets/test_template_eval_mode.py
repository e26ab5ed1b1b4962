"""A template says where its rollouts are evaluated (eval_mode): set through the API, carried to the next
version, part of the spec hash only when it is not the default (older versions keep their hash)."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from webapp.fleets import services
from webapp.fleets.models import EnvironmentTemplate

pytestmark = pytest.mark.django_db
SPEC_BEFORE_EVAL_MODE = ("image", "rootfs", "cpu", "memory_mb", "pids", "disk_mb", "network", "allow_list",
                         "setup_commands", "max_lifetime_s", "idle_timeout_s", "reusable")


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("ops", is_superuser=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def test_the_api_sets_eval_mode_and_the_next_version_keeps_it(api):
    first = api.post("/api/v1/templates/", {"name": "py", "eval_mode": "fresh-sandbox"}, format="json")
    second = api.post("/api/v1/templates/", {"name": "py", "cpu": 2.0}, format="json")

    assert first.status_code == 201 and second.status_code == 201, second.json()
    assert first.json()["eval_mode"] == second.json()["eval_mode"] == "fresh-sandbox"
    assert EnvironmentTemplate.objects.get(name="py", version=2).eval_mode == "fresh-sandbox"


def test_an_unknown_eval_mode_is_refused_naming_the_field(api):
    response = api.post("/api/v1/templates/", {"name": "x", "eval_mode": "trust-the-agent"}, format="json")

    assert response.status_code == 400 and "eval_mode" in response.json()
    assert not EnvironmentTemplate.objects.exists()
    with pytest.raises(Exception, match="eval_mode"):
        services.template_create(name="y", eval_mode="trust-the-agent")


def test_the_default_mode_leaves_the_spec_hash_as_it_was_before_the_field_existed():
    in_place = services.template_create(name="a")
    fresh = services.template_revise(template=in_place, eval_mode="fresh-sandbox")

    before = {field: getattr(in_place, field) for field in SPEC_BEFORE_EVAL_MODE}
    assert in_place.spec_hash == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert fresh.spec_hash != in_place.spec_hash
