"""Schemathesis against the schema the API serves: generated requests, through the real WSGI app and database,
with a token of each scope. No response may be a 5xx, and every response must be one the schema describes
(status code, content type, body). Bounded (a few derandomized examples per operation, no shrinking) so it
runs in the normal suite; the fuller run is in the docs (`schemathesis run` against a served instance).

Every check runs but `positive_data_acceptance`: the schema types each field, it cannot say everything the
API validates (a filter's vocabulary, "ids or filter, one of them", a task set's JSONL), so schema-valid input
is still refused with a 400 that names the field — which is what the API should do. The fuller run keeps it
and reads its reports as a list of validations the schema could describe better.

Operations that start expensive work are left out: job submission and re-runs (they queue rollouts), dataset
creation and builds (they queue a build), registering a model endpoint (it resolves the host it is given).
"""

from __future__ import annotations

import itertools
import re

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.urls import resolve
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.experience.services.store_factories import run_record, stored
from tests.webapp.fleets.fleet_factories import warm_rows
from tests.webapp.rollouts.jobs_factories import make_job
from webapp.access.scopes import SCOPES, required_scope
from webapp.access.tokens import token_issue

pytestmark = pytest.mark.django_db

EXPENSIVE = {
    ("POST", "/api/v1/jobs/"),
    ("POST", "/api/v1/jobs/{job_id}/rerun-failed/"),
    ("POST", "/api/v1/datasets/"),
    ("POST", "/api/v1/datasets/{ref}/versions/"),
    ("POST", "/api/v1/endpoints/"),
}
EXAMPLES_WITH_THE_SCOPE = 4
EXAMPLES_ON_REAL_OBJECTS = 3  # path parameters pinned to rows that exist, so the views get past their lookups
EXAMPLES_WITHOUT = 1


@pytest.fixture
def wsgi_app():
    """The project's WSGI app on the test's database connection (as Django's test client does it)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def keys():
    """A token per scope, each its only scope; the user holds every scope, so the token is what limits it."""
    owner = get_user_model().objects.create_superuser("fuzz", "fuzz@example.com", "pw")
    return {scope: token_issue(user=owner, name=scope, scopes=[scope]).key for scope in SCOPES}


@pytest.fixture
def objects() -> dict[str, object]:
    """Path parameter -> a row that exists (names shared by two routes are told apart by the path)."""
    job = make_job(["a", "b"])
    run_id, _ = stored(run_record(), run_record())
    (sandbox,) = warm_rows(job.fleet, 1)
    return {"job_id": job.pk, "rollout_id": job.rollouts.first().pk, "fleet_id": job.fleet_id,
            "template_id": job.fleet.template_id, "trajectory_id": run_id, "sandbox_id": sandbox.pk,
            "/api/v1/endpoints/{name}/": {"name": job.endpoint.name}}


def needed_scope(method: str, path: str) -> str:
    view = resolve(re.sub(r"\{[^}]+\}", "1", path)).func  # every path parameter takes "1"
    return required_scope(getattr(view, "view_class", None) or view.cls, method)


def real_path(operation, objects: dict) -> dict | None:
    """The operation's path parameters, every one of them a real row; None when one has no row here."""
    names = re.findall(r"\{([^}]+)\}", operation.path)
    given = {**objects, **objects.get(operation.path, {})}
    if not names or any(name not in given for name in names):
        return None
    return {name: given[name] for name in names}


def fuzz(operation, headers: dict[str, str], examples: int, path: dict | None = None) -> list[str]:
    problems: list[str] = []
    strategy = operation.as_strategy(path_parameters=path) if path else operation.as_strategy()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        # identity: the WSGI client does not undo a gzip Content-Encoding (the step index is gzipped) as HTTP
        # clients do
        response = case.call(headers={**headers, "Accept-Encoding": "identity"})
        try:
            case.validate_response(response, headers=headers, excluded_checks=[positive_data_acceptance])
        except BaseException as failure:  # noqa: BLE001 (a FailureGroup: every operation's are reported)
            body = response.content[:300]
            problems.append(f"{case.method} {case.formatted_path} {case.query or ''} -> {response.status_code} "
                            f"{body}: {str(failure).splitlines()[2:4]}")

    run()
    return problems


def test_the_served_schema_holds_for_every_scope(wsgi_app, keys, objects):
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app,
                                            headers={"Authorization": f"Bearer {keys['jobs:read']}"})
    problems: list[str] = []
    tried = set()
    rotation = itertools.cycle(SCOPES)
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) in EXPENSIVE:
            continue
        needed = needed_scope(operation.method.upper(), operation.path)
        other = next(scope for scope in rotation if scope != needed)  # each scope's token gets its turn
        for scope, examples in ((needed, EXAMPLES_WITH_THE_SCOPE), (other, EXAMPLES_WITHOUT)):
            problems += fuzz(operation, {"Authorization": f"Bearer {keys[scope]}"}, examples)
            tried.add(scope)
        path = real_path(operation, objects)
        if path:
            problems += fuzz(operation, {"Authorization": f"Bearer {keys[needed]}"}, EXAMPLES_ON_REAL_OBJECTS, path)
    assert problems == []
    assert tried == set(SCOPES)  # every scope's token was used
