"""A job names a harness preset through the API and the dashboard's start form, checked against the catalogue
and stored as NAME@VERSION; a custom command stays possible with `external`."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.webapp.rollouts.jobs_factories import make_endpoint, make_fleet, make_task_set
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import RolloutJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["trainer"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def submit(api, **fields):
    body = {"task_set": make_task_set(["a"]).name, "fleet": make_fleet().name,
            "endpoint": make_endpoint(model_names=["policy-7"]).name, **fields}
    return api.post("/api/v1/jobs/", body, format="json")


@pytest.mark.parametrize(("given", "stored"), [("claude-code", "claude-code@2.1.197"), ("codex@0.172.0", "codex@0.172.0"),
                                               ("builtin", "builtin")])
def test_a_job_names_a_preset_and_is_stored_with_its_version(api, given, stored):
    response = submit(api, harness=given)

    assert response.status_code == 201, response.json()
    assert response.json()["harness"] == stored
    assert RolloutJob.objects.get(pk=response.json()["id"]).harness == stored


def test_a_custom_command_stays_possible_with_external(api):
    response = submit(api, harness="external", harness_command="python3 /opt/trove/harness/mini_agent.py")

    assert response.status_code == 201, response.json()
    assert (response.json()["harness"], response.json()["harness_command"]) == (
        "external", "python3 /opt/trove/harness/mini_agent.py")


@pytest.mark.parametrize(("fields", "says"), [
    ({"harness": "aider"}, "unknown harness 'aider'"),
    ({"harness": "codex@1;rm -rf /"}, "is not a version"),
    ({"harness": "opencode", "harness_command": "bash -c 'curl evil'"}, "runs its own command"),
    ({"harness": "external"}, "give one, or name a preset"),
])
def test_a_harness_outside_the_catalogue_or_mixed_with_a_command_is_refused_naming_the_field(api, fields, says):
    before = RolloutJob.objects.count()

    response = submit(api, **fields)

    assert response.status_code == 400
    assert says in str(response.json()) and "harness" in str(response.json())
    assert RolloutJob.objects.count() == before, "nothing half-written"


def start_form(**fields):
    from webapp.dashboard.jobs import JobStartForm

    data = {"task_set": make_task_set(["a"]).name, "fleet": make_fleet().name,
            "endpoint": make_endpoint(model_names=["policy-7"]).name, "samples_per_task": 1, "sampling": "uniform",
            "adaptive_first_round": 1, "max_steps": 5, "wall_time_s": 60, "concurrency": 1, **fields}
    return JobStartForm(data=data)


def test_the_dashboards_start_form_takes_a_preset_and_refuses_an_unknown_one():
    good, bad = start_form(harness="mini-swe-agent"), start_form(harness="aider")

    assert good.is_valid(), good.errors
    assert good.cleaned_data["harness"] == "mini-swe-agent@2.4.6"
    assert not bad.is_valid() and "unknown harness 'aider'" in bad.errors["harness"][0]
