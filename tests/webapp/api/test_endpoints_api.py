"""The model endpoints API: ops register, everyone who reads jobs lists; a trainer cannot register one, and no
registration can name the server's own secrets or, without the flag, a private address."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from webapp.access.scopes import ROLES
from webapp.access.tokens import token_issue
from webapp.rollouts.endpoints import endpoint_register
from webapp.rollouts.models import ModelEndpoint

pytestmark = pytest.mark.django_db
PUBLIC = "http://93.184.216.34/v1"  # an IP literal: registration resolves no name, and it is public


def persona(role: str | None, *, scoped: bool = True) -> APIClient:
    """A client acting as a user in `role` (no group for None): with a scoped token of the role's preset, or a
    session."""
    user = get_user_model().objects.create_user(f"{role or 'nobody'}-{'token' if scoped else 'session'}")
    if role:
        user.groups.add(Group.objects.get(name=role))
    client = APIClient()
    if scoped and role:
        issued = token_issue(user=user, name="test", scopes=list(ROLES[role]))
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    else:
        client.force_login(user)
    client.user = user
    return client


def register(client: APIClient, **fields):
    body = {"name": "openai", "base_url": PUBLIC, "model_names": ["gpt-4.1-mini"], **fields}
    return client.post("/api/v1/endpoints/", body, format="json")


def test_ops_register_an_endpoint_and_a_trainer_lists_it(monkeypatch):
    monkeypatch.setenv("TROVE_MODEL_KEY_OPENAI", "sk-real-key-never-shown-1234")
    ops, trainer = persona("ops"), persona("trainer")

    created = register(ops, key_ref="env:TROVE_MODEL_KEY_OPENAI", protocol="chat", description="hosted")

    assert created.status_code == 201, created.json()
    endpoint = ModelEndpoint.objects.get(name="openai")
    assert (endpoint.base_url, endpoint.key_ref, endpoint.created_by) == (PUBLIC, "env:TROVE_MODEL_KEY_OPENAI", ops.user)
    assert endpoint.allow_private_network is False
    listed = trainer.get("/api/v1/endpoints/")
    assert listed.status_code == 200
    [row] = listed.json()["results"]
    assert (row["name"], row["model_names"], row["created_by"]) == ("openai", ["gpt-4.1-mini"], ops.user.username)
    assert trainer.get("/api/v1/endpoints/openai/").json()["base_url"] == PUBLIC
    assert "sk-real-key-never-shown-1234" not in created.content.decode() + listed.content.decode()


@pytest.mark.parametrize(("role", "scoped"), [("trainer", True), ("trainer", False), ("researcher", True),
                                              (None, False)])
def test_who_is_not_ops_cannot_register_an_endpoint(role, scoped):
    response = register(persona(role, scoped=scoped))

    assert response.status_code == 403
    assert not ModelEndpoint.objects.exists()


@pytest.mark.parametrize("reference", [
    "env:SECRET_KEY", "env:DATABASE_URL", "env:TROVE_MODEL_KEY_", "file:/etc/shadow", "file:../../etc/passwd",
    "file:.hidden", "sk-pasted-the-key-itself", "vault:secret/x",
])
def test_a_key_reference_outside_the_allow_list_is_refused_without_echoing_it(reference, settings, tmp_path):
    settings.TROVE_MODEL_SECRETS_DIR = str(tmp_path)

    response = register(persona("ops"), key_ref=reference)

    assert response.status_code == 400
    assert response.json()["field"] == "key_ref"
    assert "sk-pasted-the-key-itself" not in response.content.decode()
    assert not ModelEndpoint.objects.exists()


@pytest.mark.parametrize(("base_url", "reason"), [
    ("http://127.0.0.1:8000/v1", "loopback"), ("http://localhost:8000/v1", "loopback"),
    ("http://169.254.169.254/latest", "link-local"), ("http://10.0.0.7:8000/v1", "private"),
    ("http://[::1]:8000/v1", "loopback"),
])
def test_a_private_address_needs_allow_private_network(base_url, reason):
    admin = get_user_model().objects.create_superuser("root-admin")
    client = APIClient()
    client.force_login(admin)

    refused = register(client, base_url=base_url)
    allowed = register(client, base_url=base_url, allow_private_network=True)

    assert refused.status_code == 400 and refused.json()["field"] == "base_url"
    assert reason in refused.json()["detail"] and "allow_private_network" in refused.json()["detail"]
    assert allowed.status_code == 201 and ModelEndpoint.objects.get().allow_private_network is True


@pytest.mark.parametrize("scoped", [True, False])
@pytest.mark.parametrize("base_url", ["http://169.254.169.254/latest", "http://127.0.0.1:8000/v1", PUBLIC])
def test_ops_cannot_open_private_networks_only_an_admin_can(base_url, scoped):
    """The attack: an ops account registers an endpoint that may reach Trove's own web app or a cloud's
    metadata service, then points a job at it. Allowing private networks is an admin's decision."""
    response = register(persona("ops", scoped=scoped), base_url=base_url, allow_private_network=True)

    assert response.status_code == 403, response.content
    assert response.json()["field"] == "allow_private_network" and "only an admin" in response.json()["detail"]
    assert not ModelEndpoint.objects.exists()


@pytest.mark.parametrize(("change", "field"), [
    ({"base_url": "ftp://example.com/v1"}, "base_url"),
    ({"base_url": "https://user:sk-in-the-url@example.com/v1"}, "base_url"),
    ({"base_url": "https://example.com/v1?key=sk-in-the-query"}, "base_url"),
    ({"name": "Not A Slug!"}, "name"),
    ({"protocol": "grpc"}, "protocol"),
    ({"model_names": []}, "model_names"),
    ({"api_key": "sk-pasted"}, "api_key"),
    ({"token_capture": "tgi"}, "token_capture"),
    ({"token_capture": "vllm", "protocol": "messages"}, "token_capture"),
    ({"policy_version_from": "cookie:session"}, "policy_version_from"),
    ({"policy_version_from": "header:X Bad Name"}, "policy_version_from"),
    ({"policy_version_from": "body:a.b.c.d.e.f"}, "policy_version_from"),
    ({"policy_version_from": "body:__class__..x"}, "policy_version_from"),
])
def test_bad_registrations_name_the_field_and_write_nothing(change, field):
    response = register(persona("ops"), **change)

    assert response.status_code == 400, response.json()
    body = response.json()
    assert body.get("field") == field or field in body, body
    assert "sk-in-the-url" not in response.content.decode() and "sk-pasted" not in response.content.decode()
    assert not ModelEndpoint.objects.exists()


def test_an_endpoint_registered_with_token_capture_says_so():
    ops = persona("ops")
    created = register(ops, token_capture="sglang", policy_version_from="body:metadata.weight_version")

    assert created.status_code == 201, created.json()
    assert (created.json()["token_capture"], created.json()["policy_version_from"]) == \
        ("sglang", "body:metadata.weight_version")
    endpoint = ModelEndpoint.objects.get()
    assert (endpoint.token_capture, endpoint.policy_version_from) == ("sglang", "body:metadata.weight_version")
    assert register(ops, name="plain").json()["token_capture"] == "off"


def test_a_taken_name_is_a_conflict():
    ops = persona("ops")
    assert register(ops).status_code == 201

    again = register(ops, base_url="https://example.org/v1")

    assert again.status_code == 409 and again.json()["field"] == "name"
    assert ModelEndpoint.objects.get().base_url == PUBLIC


def test_an_unknown_endpoint_is_a_404_naming_it():
    response = persona("trainer").get("/api/v1/endpoints/nope/")

    assert response.status_code == 404 and response.json()["field"] == "name"


def test_the_list_costs_the_same_queries_for_one_endpoint_or_many(django_assert_num_queries):
    trainer = persona("trainer")
    ops_user = persona("ops").user
    endpoint_register(name="first", base_url=PUBLIC, protocol="chat", model_names=["m"], created_by=ops_user)
    trainer.get("/api/v1/endpoints/")  # warm the session and permission caches
    with django_assert_num_queries(2) as one:  # the token, the page (with its creators)
        assert len(trainer.get("/api/v1/endpoints/").json()["results"]) == 1
    for n in range(5):
        endpoint_register(name=f"more-{n}", base_url=PUBLIC, protocol="chat", model_names=["m"], created_by=ops_user)

    with django_assert_num_queries(len(one.captured_queries)):
        assert len(trainer.get("/api/v1/endpoints/").json()["results"]) == 6
