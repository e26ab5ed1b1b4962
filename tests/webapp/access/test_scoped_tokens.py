"""Scoped API tokens: issued with a hash only, checked on every request, scoped per area and method."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from webapp.access.models import ApiToken
from webapp.access.roles import ROLE_PERMISSIONS
from webapp.access.scopes import ROLES, UnknownScope
from webapp.access.tokens import token_issue, token_revoke

pytestmark = pytest.mark.django_db


@pytest.fixture
def user():
    """A trainer: the role behind a token bounds what the token may do."""
    trainer = get_user_model().objects.create_user("trainer")
    trainer.groups.add(Group.objects.get(name="trainer"))
    return trainer


def client_with(key: str, keyword: str = "Bearer") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {key}")
    return client


def issue(user, *scopes: str, **kwargs):
    return token_issue(user=user, name="test", scopes=list(scopes), **kwargs)


def test_only_the_hash_of_the_key_is_stored(user):
    issued = issue(user, "jobs:read")
    row = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.key.startswith(f"trv_{row.prefix}_")
    assert issued.key not in str(row.__dict__.values())
    assert len(row.key_hash) == 64


def test_read_scope_reads_but_does_not_write(user):
    api = client_with(issue(user, "jobs:read").key)
    assert api.get("/api/v1/jobs/").status_code == 200
    refused = api.post("/api/v1/jobs/", {}, format="json")
    assert refused.status_code == 403
    assert "jobs:write" in refused.json()["detail"]


def test_scope_of_one_area_does_not_open_another(user):
    api = client_with(issue(user, "datasets:read").key)
    assert api.get("/api/v1/datasets/").status_code == 200
    refused = api.get("/api/v1/trajectories/")
    assert refused.status_code == 403
    assert "trajectories:read" in refused.json()["detail"]
    assert api.get("/api/v1/fleets/").status_code == 403


def test_write_scope_reaches_the_view(user):
    """A write scope passes the check: the request gets as far as the view's own validation."""
    api = client_with(issue(user, "jobs:write").key)
    response = api.post("/api/v1/jobs/", {}, format="json")
    assert response.status_code == 400


def test_the_token_keyword_works_too(user):
    """trove_client sends `Token <key>`: a scoped key works under either keyword."""
    assert client_with(issue(user, "jobs:read").key, keyword="Token").get("/api/v1/jobs/").status_code == 200


def test_curation_needs_its_own_scope_and_the_user_permission(user):
    ids = {"ids": [], "action": "approve", "reason": "ok"}
    read_only = client_with(issue(user, "trajectories:read", "trajectories:write").key)
    refused = read_only.post("/api/v1/trajectories/curate/", ids, format="json")
    assert refused.status_code == 403 and "trajectories:curate" in refused.json()["detail"]
    curate = client_with(issue(user, "trajectories:curate").key)
    # The scope alone is not enough: the user lacks experience.change_trajectory.
    assert curate.post("/api/v1/trajectories/curate/", ids, format="json").status_code == 403
    user.groups.add(Group.objects.get(name="curator"))
    allowed = curate.post("/api/v1/trajectories/curate/", ids, format="json")
    assert allowed.status_code != 403, allowed.content


@pytest.mark.parametrize("problem", ["revoked", "expired", "wrong secret", "unknown prefix", "malformed"])
def test_refused_keys_get_401_saying_why(user, problem):
    issued = issue(user, "jobs:read")
    key = issued.key
    expected = "invalid"
    if problem == "revoked":
        token_revoke(token=issued.token)
        expected = "revoked"
    elif problem == "expired":
        ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
        expected = "expired"
    elif problem == "wrong secret":
        key = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")
    elif problem == "unknown prefix":
        key = "trv_000000000000_" + key.split("_", 2)[2]
    else:
        key, expected = "trv_nounderscore", "malformed"
    response = client_with(key).get("/api/v1/jobs/")
    assert response.status_code == 401
    assert expected in response.json()["detail"]


def test_an_inactive_user_cannot_use_a_token(user):
    key = issue(user, "jobs:read").key
    user.is_active = False
    user.save()
    assert client_with(key).get("/api/v1/jobs/").status_code == 401


def test_last_used_is_recorded_once_a_minute(user):
    issued = issue(user, "jobs:read")
    api = client_with(issued.key)
    api.get("/api/v1/jobs/")
    first = ApiToken.objects.get(pk=issued.token.pk).last_used_at
    assert first is not None
    api.get("/api/v1/jobs/")
    assert ApiToken.objects.get(pk=issued.token.pk).last_used_at == first


def test_plain_drf_tokens_act_with_their_users_roles(user):
    from rest_framework.authtoken.models import Token

    api = client_with(Token.objects.create(user=user).key, keyword="Token")
    assert api.get("/api/v1/trajectories/").status_code == 200
    assert api.get("/api/v1/fleets/").status_code == 200  # every account reads
    refused = api.post("/api/v1/fleets/", {"name": "f", "template": 1}, format="json")
    assert refused.status_code == 403 and "'fleets:write' needs the role ops" in refused.json()["detail"]
    assert api.post("/api/v1/jobs/", {}, format="json").status_code == 400  # a trainer submits jobs


def test_a_token_never_does_more_than_its_user(user):
    """The token carries fleets:write, its user (a trainer) has not: refused, and allowed once they are ops."""
    api = client_with(issue(user, "fleets:read", "fleets:write").key)
    refused = api.post("/api/v1/fleets/", {"name": "f", "template": 1}, format="json")
    assert refused.status_code == 403 and "needs the role ops" in refused.json()["detail"]
    user.groups.add(Group.objects.get(name="ops"))
    assert api.post("/api/v1/fleets/", {"name": "f", "template": 999999}, format="json").status_code == 404


def test_unknown_scopes_and_empty_scopes_are_refused(user):
    with pytest.raises(UnknownScope, match="jobs:delete"):
        issue(user, "jobs:delete")
    with pytest.raises(UnknownScope, match="at least one"):
        issue(user)
    with pytest.raises(ValueError, match="future"):
        issue(user, "jobs:read", expires_at=timezone.now() - timedelta(days=1))


def test_every_api_view_names_its_area():
    """Fail closed is the default, so an endpoint added without an area would be closed to every token:
    catch it here instead of in a trainer's logs."""
    from django.urls import get_resolver

    missing = []

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
                continue
            view = getattr(pattern.callback, "view_class", None) or getattr(pattern.callback, "cls", None)
            path = prefix + str(pattern.pattern)
            if view is None or not path.startswith("api/v1/"):
                continue
            if getattr(view, "scope_area", None) is None:
                missing.append(path)

    walk(get_resolver().url_patterns)
    assert missing == []


def test_the_command_issues_lists_and_revokes(user):
    out, err = StringIO(), StringIO()
    call_command("api_token", "create", "trainer", "--name", "gpu-7", "--role", "trainer", "--expires-in-days", "30",
                 stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert key.startswith("trv_")
    token = ApiToken.objects.get(name="gpu-7")
    assert token.scopes == sorted(ROLES["trainer"])
    assert client_with(key).get("/api/v1/datasets/").status_code == 200
    listing = StringIO()
    call_command("api_token", "list", stdout=listing)
    assert "gpu-7" in listing.getvalue() and key not in listing.getvalue() and "live" in listing.getvalue()
    call_command("api_token", "revoke", key, stdout=StringIO())
    assert client_with(key).get("/api/v1/datasets/").status_code == 401
    warned = StringIO()
    call_command("api_token", "create", "trainer", "--name", "ops-ish", "--scope", "fleets:write", stdout=StringIO(),
                 stderr=warned)
    assert "trainer does not hold fleets:write" in warned.getvalue()
    with pytest.raises(CommandError, match="no user"):
        call_command("api_token", "create", "nobody", "--name", "x", "--scope", "jobs:read", stdout=StringIO())
    with pytest.raises(CommandError, match="unknown scope"):
        call_command("api_token", "create", "trainer", "--name", "x", "--scope", "jobs:nope", stdout=StringIO())


def test_role_groups_exist_with_their_permissions():
    for role, names in ROLE_PERMISSIONS.items():
        granted = {f"{p.content_type.app_label}.{p.codename}" for p in Group.objects.get(name=role).permissions.all()}
        assert granted == set(names)
    curator = get_user_model().objects.create_user("cur")
    curator.groups.add(Group.objects.get(name="curator"))
    assert curator.has_perm("experience.change_trajectory")
    assert not curator.has_perm("fleets.add_fleet")


def test_admin_issues_a_token_and_shows_its_key_once(client):
    admin = get_user_model().objects.create_superuser("root", password="pw")
    client.force_login(admin)
    response = client.post("/admin/access/apitoken/add/", {
        "user": admin.pk, "name": "ci", "scopes": ["trajectories:read"], "role": ""}, follow=True)
    assert response.status_code == 200
    token = ApiToken.objects.get(name="ci")
    shown = [str(m) for m in response.context["messages"]]
    key = next(word for text in shown for word in text.split() if word.startswith("trv_"))
    assert client_with(key).get("/api/v1/trajectories/").status_code == 200
    assert token.scopes == ["trajectories:read"]
    change_page = client.get(f"/admin/access/apitoken/{token.pk}/change/")
    assert change_page.status_code == 200 and key not in change_page.content.decode()
    assert Permission.objects.filter(codename="add_apitoken").exists()


def test_openapi_schema_describes_bearer_tokens(client, user):
    assert client.get("/api/schema/?format=json").status_code in (401, 403)
    client.force_login(user)
    schema = client.get("/api/schema/?format=json").json()
    assert schema["components"]["securitySchemes"]["scopedToken"]["scheme"] == "bearer"
