"""Every URL, every method, every role: one table says which scope each needs, and every persona (each role, a
signed-in user with no role, a superuser, nobody) is tried against every URL the resolver knows — through a
session, a plain DRF token and a scoped token — and must be let through or refused exactly as the table says.

The walk is over the resolver, so a URL added without a line in TABLE fails here, and so does an API view that
grows a method the table does not list.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from rest_framework.views import APIView

from tests.experience.services.store_factories import run_record, stored
from tests.webapp.rollouts.jobs_factories import make_job
from webapp.access.roles import role_groups_sync
from webapp.access.scopes import BASELINE_SCOPES, ROLES, SCOPES
from webapp.access.tokens import token_issue

pytestmark = pytest.mark.django_db

PUBLIC, SIGNED_IN, PEOPLE = "public", "any signed-in account", "any signed-in person (a session)"

# What each role may change, as DESIGN and issue 12 put it; everyone reads.
ACTS: dict[str, set[str]] = {
    "ops": {"fleets:write", "jobs:write", "endpoints:write"},
    "researcher": {"jobs:write", "datasets:write", "trajectories:write"},
    "curator": {"trajectories:curate"},
    "trainer": {"jobs:write"},
    "none": set(),
}

# URL name -> method -> the scope it needs (or PUBLIC / SIGNED_IN / PEOPLE).
TABLE: dict[str, dict[str, str]] = {
    "login": {"GET": PUBLIC},
    "logout": {"POST": PUBLIC},
    "schema": {"GET": SIGNED_IN},
    "api-docs": {"GET": PEOPLE},
    # the dashboard
    "dashboard:overview": {"GET": "jobs:read"},
    "dashboard:job": {"GET": "jobs:read"},
    "dashboard:jobs": {"GET": "jobs:read"},
    "dashboard:job-start": {"GET": "jobs:read", "POST": "jobs:write"},
    "dashboard:job-cancel": {"POST": "jobs:write"},
    "dashboard:job-rerun-failed": {"POST": "jobs:write"},
    "dashboard:rollout-cancel": {"POST": "jobs:write"},
    "dashboard:explorer": {"GET": "trajectories:read"},
    "dashboard:explorer-curate": {"POST": "trajectories:curate"},
    "dashboard:trajectory-import": {"GET": "trajectories:read", "POST": "trajectories:write"},
    "dashboard:saved-filter-create": {"POST": "trajectories:curate"},
    "dashboard:saved-filter-delete": {"POST": "trajectories:curate"},
    "dashboard:trajectory": {"GET": "trajectories:read"},
    "dashboard:run-curate": {"POST": "trajectories:curate"},
    "dashboard:step-label": {"POST": "trajectories:curate"},
    "dashboard:rubric-override": {"POST": "trajectories:curate"},
    "dashboard:trajectory-compare": {"GET": "trajectories:read"},
    "dashboard:trajectory-compare-similar": {"GET": "trajectories:read"},
    "dashboard:clusters": {"GET": "trajectories:read"},
    "dashboard:queues": {"GET": "trajectories:read", "POST": "trajectories:curate"},
    "dashboard:pairs": {"GET": "trajectories:read", "POST": "trajectories:curate"},
    "dashboard:queue": {"GET": "trajectories:read"},
    "dashboard:queue-next": {"POST": "trajectories:curate"},
    "dashboard:queue-decide": {"POST": "trajectories:curate"},
    "dashboard:cluster": {"GET": "trajectories:read"},
    "dashboard:cluster-split": {"POST": "trajectories:curate"},
    "dashboard:cluster-merge": {"POST": "trajectories:curate"},
    "dashboard:fleets": {"GET": "fleets:read", "POST": "fleets:write"},
    "dashboard:fleet": {"GET": "fleets:read"},
    "dashboard:fleet-scale": {"POST": "fleets:write"},
    "dashboard:fleet-drain": {"POST": "fleets:write"},
    "dashboard:fleet-template": {"POST": "fleets:write"},
    "dashboard:datasets": {"GET": "datasets:read", "POST": "datasets:write"},
    "dashboard:dataset": {"GET": "datasets:read"},
    "dashboard:dataset-build": {"POST": "datasets:write"},
    "dashboard:dataset-version": {"GET": "datasets:read"},
    "dashboard:dataset-compare": {"GET": "datasets:read"},
    "dashboard:dataset-manifest": {"GET": "datasets:read"},
    # the API: jobs and model endpoints
    "api-jobs": {"GET": "jobs:read", "POST": "jobs:write"},
    "api-job": {"GET": "jobs:read"},
    "api-job-rollouts": {"GET": "jobs:read"},
    "api-job-samples": {"GET": "jobs:read"},
    "api-job-cancel": {"POST": "jobs:write"},
    "api-job-rerun-failed": {"POST": "jobs:write"},
    "job-live": {"GET": "jobs:read"},
    "api-rollout-cancel": {"POST": "jobs:write"},
    "api-task-sets": {"GET": "jobs:read", "POST": "jobs:write"},
    "api-endpoints": {"GET": "jobs:read", "POST": "endpoints:write"},
    "api-endpoint": {"GET": "jobs:read"},
    # fleets
    "api-templates": {"GET": "fleets:read", "POST": "fleets:write"},
    "api-template": {"GET": "fleets:read"},
    "api-fleets": {"GET": "fleets:read", "POST": "fleets:write"},
    "api-fleet": {"GET": "fleets:read"},
    "api-fleet-scale": {"POST": "fleets:write"},
    "api-fleet-drain": {"POST": "fleets:write"},
    "api-fleet-template": {"POST": "fleets:write"},
    "api-fleet-events": {"GET": "fleets:read"},
    "api-sandboxes": {"GET": "fleets:read"},
    "api-sandbox": {"GET": "fleets:read"},
    # trajectories
    "api-trajectories": {"GET": "trajectories:read", "POST": "trajectories:write"},
    "api-trajectories-import": {"POST": "trajectories:write"},
    "api-trajectories-export": {"GET": "trajectories:read"},
    "api-trajectories-curate": {"POST": "trajectories:curate"},
    "api-trajectory": {"GET": "trajectories:read"},
    "api-trajectory-steps": {"GET": "trajectories:read", "POST": "trajectories:write"},
    "api-trajectory-similar": {"GET": "trajectories:read"},
    "api-trajectory-outcome": {"POST": "trajectories:curate"},
    "api-outcomes": {"POST": "trajectories:curate"},
    "api-trajectory-events": {"GET": "trajectories:read"},
    "api-steps-view": {"GET": "trajectories:read"},
    "api-steps-index": {"GET": "trajectories:read"},
    "api-steps-search": {"GET": "trajectories:read"},
    "api-step-view": {"GET": "trajectories:read"},
    "api-step-context": {"GET": "trajectories:read"},
    # datasets
    "api-datasets": {"GET": "datasets:read", "POST": "datasets:write"},
    "api-dataset": {"GET": "datasets:read"},
    "api-dataset-versions": {"POST": "datasets:write"},
    "api-dataset-version": {"GET": "datasets:read"},
    "api-dataset-file": {"GET": "datasets:read"},
    "api-dataset-compare": {"GET": "datasets:read"},
}

# The Django admin checks is_staff and the model permissions itself; the role groups hold exactly the
# permissions of their scopes (roles.py), so it agrees with this table. Its URLs are its own.
LEFT_TO_DJANGO = ("admin",)

PERSONAS = [*ROLES, "none", "superuser"]
KINDS = ["session", "plain token", "scoped token"]


@dataclass(frozen=True)
class Route:
    name: str
    kwargs: tuple[str, ...]
    view_class: type | None

    def methods_of_view(self) -> set[str] | None:
        """The methods an API view implements (other views: unknown, the table says)."""
        if self.view_class is None or not issubclass(self.view_class, APIView):
            return None
        return {m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(self.view_class, m)}


def routes() -> Iterator[Route]:
    """Every named URL the project serves, from the resolver itself."""

    def walk(patterns, namespace: str, kwargs: tuple[str, ...]):
        for entry in patterns:
            names = kwargs + tuple(getattr(entry.pattern, "converters", {}))
            if isinstance(entry, URLResolver):
                inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
                yield from walk(entry.url_patterns, inner, names)
            elif isinstance(entry, URLPattern):
                callback = entry.callback
                view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
                yield Route(f"{namespace}{entry.name or '<unnamed ' + str(entry.pattern) + '>'}", names, view)

    yield from walk(get_resolver().url_patterns, "", ())


def test_every_url_is_in_the_table_with_the_methods_its_view_has():
    missing, wrong_methods = [], []
    for route in routes():
        if route.name.split(":")[0] in LEFT_TO_DJANGO:
            continue
        if route.name not in TABLE:
            missing.append(route.name)
            continue
        implemented = route.methods_of_view()
        if implemented is not None and implemented != set(TABLE[route.name]):
            wrong_methods.append((route.name, sorted(implemented), sorted(TABLE[route.name])))
    assert missing == [], f"add these URLs to TABLE with the scope each method needs: {missing}"
    assert wrong_methods == []


def test_the_roles_act_as_the_issue_says():
    assert {role: set(scopes) - BASELINE_SCOPES for role, scopes in ROLES.items()} == {
        role: acts for role, acts in ACTS.items() if role != "none"}


# --- the walk ---------------------------------------------------------------------------------------------


@pytest.fixture
def world():
    """One of everything the URLs name, so an allowed GET is a real page; names nothing exists for are 404s,
    which still tell a permission check passed (refusals come before lookups)."""
    job = make_job(["a"])
    (run_id,) = stored(run_record())
    return {
        "job_id": job.pk, "rollout_id": job.rollouts.first().pk, "fleet_id": job.fleet_id,
        "template_id": job.fleet.template_id, "trajectory_id": run_id, "sandbox_id": 999_999,
        "cluster_id": 999_999, "queue_id": 999_999, "item_id": 999_999, "saved_filter_id": 999_999,
        "seq": 0, "ref": "no-such-dataset", "name": "no-such-dataset", "version": 1,
        "endpoint": job.endpoint.name, "file": "rows.jsonl",
    }


def url_of(route: Route, world: dict) -> str:
    given = dict(world)
    if route.name == "api-endpoint":
        given["name"] = world["endpoint"]
    if route.name == "api-dataset-file":
        given["name"] = world["file"]
    return reverse(route.name, kwargs={key: given[key] for key in route.kwargs})


def persona_user(persona: str):
    users = get_user_model().objects
    if persona == "superuser":
        return users.create_superuser("root", "root@example.com", "pw")
    user = users.create_user(f"u-{persona}")
    if persona in ROLES:
        user.groups.add(role_groups_sync()[persona])
    return user


def token_scopes(persona: str) -> list[str]:
    # Roles get their preset; a user with no role (and the superuser) a token with every scope, to show
    # that a token never does more than its user.
    return sorted(ROLES[persona]) if persona in ROLES else sorted(SCOPES)


def expected(persona: str, kind: str, needed: str) -> bool:
    if needed == PUBLIC:
        return True
    if needed == SIGNED_IN:
        return persona != "anonymous"
    if needed == PEOPLE:
        return persona != "anonymous" and kind == "session"
    if persona == "anonymous":
        return False
    if kind == "scoped token" and needed not in token_scopes(persona):
        return False
    return persona == "superuser" or needed in BASELINE_SCOPES or needed in ACTS[persona]


def client_for(persona: str, kind: str):
    client = APIClient()
    if persona == "anonymous":
        return client
    user = persona_user(persona)
    if kind == "session":
        client.force_login(user)
    elif kind == "plain token":
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    else:
        key = token_issue(user=user, name="walk", scopes=token_scopes(persona)).key
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def outcome(response) -> str:
    if response.status_code in (401, 403):
        return "refused"
    if response.status_code == 302 and "/accounts/login/" in response.get("Location", ""):
        return "refused"
    return "allowed"


def walk(client, persona: str, kind: str, world: dict) -> list[tuple]:
    wrong = []
    for route in routes():
        if route.name.split(":")[0] in LEFT_TO_DJANGO:
            continue
        is_page = not route.name.startswith(("api-", "job-", "schema"))
        if kind != "session" and is_page:
            continue  # pages are for browsers: a token there is not a login
        if route.name == "logout":
            continue  # it would end the session the rest of the walk uses
        url = url_of(route, world)
        for method, needed in TABLE[route.name].items():
            if method == "GET":
                response = client.get(url)
            else:
                response = client.post(url, {}, format="json") if not is_page else client.post(url, {})
            want = "allowed" if expected(persona, kind, needed) else "refused"
            if outcome(response) != want:
                wrong.append((method, url, needed, f"wanted {want}, got {response.status_code}"))
    return wrong


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("persona", PERSONAS)
def test_every_url_lets_through_exactly_whom_the_table_says(persona, kind, world):
    client = client_for(persona, kind)
    assert walk(client, persona, kind, world) == []


def test_nobody_signed_in_gets_nothing_but_the_login_page(world):
    assert walk(APIClient(), "anonymous", "session", world) == []


def test_a_refusal_says_which_scope_and_which_role(world):
    session = client_for("none", "session")
    page = session.post(reverse("dashboard:fleet-drain", args=[world["fleet_id"]]))
    api = session.post(reverse("api-fleet-drain", args=[world["fleet_id"]]))

    assert page.status_code == 403 and "&#x27;fleets:write&#x27; needs the role ops" in page.content.decode()
    assert api.status_code == 403 and api.json()["detail"].startswith("'fleets:write' needs the role ops")


def test_a_user_with_no_role_changes_nothing(world):
    """The report that started this: a logged-in user with no group created, scaled and drained fleets and built
    datasets. Each attempt is refused and the rows are as they were."""
    from webapp.fleets.models import Fleet

    session = Client()
    session.force_login(persona_user("none"))
    fleet = Fleet.objects.get(pk=world["fleet_id"])
    before = (fleet.status, fleet.min_warm, fleet.max_warm, Fleet.objects.count())

    created = session.post(reverse("dashboard:fleets"), {"name": "mine", "template": world["template_id"],
                                                         "backend": "local", "min_warm": 0, "max_warm": 1,
                                                         "max_total": 1, "sizing": "backlog", "miss_policy": "cold"})
    scaled = session.post(reverse("dashboard:fleet-scale", args=[fleet.pk]),
                          {"min_warm": 3, "max_warm": 5, "max_total": 9, "refill_per_minute": 60})
    drained = session.post(reverse("dashboard:fleet-drain", args=[fleet.pk]))
    built = session.post(reverse("dashboard:datasets"), {"name": "d", "kind": "outcome"})

    assert [r.status_code for r in (created, scaled, drained, built)] == [403] * 4
    fleet.refresh_from_db()
    assert (fleet.status, fleet.min_warm, fleet.max_warm, Fleet.objects.count()) == before
    from experience.models import Dataset

    assert not Dataset.objects.exists()
