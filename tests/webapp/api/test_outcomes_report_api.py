"""POST /api/v1/outcomes/: label stored runs from a SWE-bench report or a JSONL of outcomes, as `manage.py outcomes`
does, each change a curation event naming the report; a dry run writes nothing; only curators may."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from experience.models import CurationEvent, Trajectory
from tests.experience.importers.fixture_files import SWE_BENCH_INSTANCE, SWE_BENCH_SUMMARY
from tests.experience.services.store_factories import RunFactory, stored
from webapp.access.roles import role_groups_sync
from webapp.access.tokens import token_issue

pytestmark = pytest.mark.django_db
URL = "/api/v1/outcomes/"


def person(name: str, role: str | None):
    user = get_user_model().objects.create_user(name)
    if role:
        user.groups.add(role_groups_sync()[role])
    return user


def client_for(user, key: str | None = None) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=key or f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def curator_api() -> APIClient:
    return client_for(person("curator", "curator"))


@pytest.fixture
def runs() -> dict[str, int]:
    """The summary's instances, run by its model and by another one, with no outcome yet."""
    records = [RunFactory(task_key=task, model=model, source_ref=f"{model}/{task}")
               for task in ("django__django-11099", "astropy__astropy-12907", "psf__requests-2317")
               for model in ("swe-agent-llama-70b", "other-model")]
    return dict(zip([r.source_ref for r in records], stored(*records), strict=True))


def outcomes() -> dict[str, tuple]:
    return {t.source_ref: (t.success, t.reward) for t in Trajectory.objects.all()}


def test_a_swe_bench_summary_labels_the_runs_of_its_model(curator_api, runs):
    response = curator_api.post(URL, {"report": SWE_BENCH_SUMMARY.read_text(), "name": SWE_BENCH_SUMMARY.name},
                                format="json")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["resolved"], body["unresolved"], body["labelled"], body["dry_run"]) == (1, 2, 3, False)
    assert outcomes() == {
        "swe-agent-llama-70b/django__django-11099": (True, 1.0),
        "swe-agent-llama-70b/astropy__astropy-12907": (False, 0.0),
        "swe-agent-llama-70b/psf__requests-2317": (False, 0.0),
        "other-model/django__django-11099": (None, None),
        "other-model/astropy__astropy-12907": (None, None),
        "other-model/psf__requests-2317": (None, None),
    }
    assert body["not_mentioned"] == 3 and body["not_judged"] == ["sympy__sympy-20590"]
    events = CurationEvent.objects.order_by("id")
    assert [(e.action, e.actor.username) for e in events] == [("set_outcome", "curator")] * 3
    assert {e.reason for e in events} == {f"outcomes from API upload {SWE_BENCH_SUMMARY.name}: resolved",
                                          f"outcomes from API upload {SWE_BENCH_SUMMARY.name}: unresolved"}
    assert "3 run(s) labelled (1 resolved, 2 unresolved" in body["summary"]


def test_a_dry_run_says_what_would_change_and_writes_nothing(curator_api, runs):
    body = {"report": SWE_BENCH_SUMMARY.read_text(), "name": SWE_BENCH_SUMMARY.name, "dry_run": True}
    dry = curator_api.post(URL, body, format="json").json()

    assert (dry["labelled"], dry["resolved"], dry["unresolved"], dry["dry_run"]) == (3, 1, 2, True)
    assert set(outcomes().values()) == {(None, None)} and not CurationEvent.objects.exists()
    real = curator_api.post(URL, {**body, "dry_run": False}, format="json").json()
    assert {k: real[k] for k in ("labelled", "trajectory_ids")} == {k: dry[k] for k in ("labelled", "trajectory_ids")}
    again = curator_api.post(URL, {**body, "dry_run": True}, format="json").json()
    assert (again["labelled"], again["unchanged"]) == (0, 3), "a dry run counts what already holds the label"


def test_outcome_objects_label_runs_by_ref_and_by_task_within_the_filter(curator_api, runs):
    lines = [{"source_ref": "other-model/psf__requests-2317", "reward": 1},
             {"task_id": "astropy__astropy-12907", "reward": 0.25, "success": True}]
    response = curator_api.post(URL, {"report": lines, "filter": {"model": "other-model"}}, format="json")

    assert response.status_code == 200, response.json()
    assert outcomes()["other-model/psf__requests-2317"] == (True, 1.0)
    assert outcomes()["other-model/astropy__astropy-12907"] == (True, 0.25)
    assert outcomes()["swe-agent-llama-70b/astropy__astropy-12907"] == (None, None), "outside the filter"
    jsonl = "".join(json.dumps(line) + "\n" for line in lines)
    text = curator_api.post(URL, {"report": jsonl, "filter": {"model": "other-model"}}, format="json").json()
    assert (text["labelled"], text["unchanged"]) == (0, 2), "the same outcomes as text change nothing more"


def test_a_per_instance_report_object_is_read_by_its_name(curator_api, runs):
    report = json.loads(SWE_BENCH_INSTANCE.read_text())
    response = curator_api.post(URL, {"report": report, "filter": {"model": "swe-agent-llama-70b"}}, format="json")

    assert response.status_code == 200, response.json()
    assert outcomes()["swe-agent-llama-70b/django__django-11099"] == (True, 1.0)
    assert response.json()["trajectory_ids"] == [runs["swe-agent-llama-70b/django__django-11099"]]


@pytest.mark.parametrize(("body", "says"), [
    ({"report": "{\"hello\": 1}"}, "not an evaluation report"),
    ({"report": "{\"task_id\": \"a\", \"reward\": \"high\"}\n"}, "field 'reward' must be a number"),
    ({"report": ""}, "give the report's text"),
    ({"report": [1, 2]}, "give the report's text"),
    ({}, "required"),
    ({"report": [{"task_id": "a", "reward": 1}], "filter": {"outcome": "sideways"}}, "outcome"),
])
def test_bad_input_is_a_400_that_names_the_problem_and_changes_nothing(curator_api, runs, body, says):
    response = curator_api.post(URL, body, format="json")

    assert response.status_code == 400
    assert says in json.dumps(response.json())
    assert not CurationEvent.objects.exists() and set(outcomes().values()) == {(None, None)}


def test_a_report_that_matches_no_run_is_a_400_listing_its_ids(curator_api, runs):
    response = curator_api.post(URL, {"report": [{"task_id": "nobody__nothing-1", "reward": 1}]}, format="json")

    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "outcomes_unmatched" and body["unmatched"] == ["nobody__nothing-1"]
    assert not CurationEvent.objects.exists()


def test_only_a_curator_may_label_and_a_token_needs_the_curate_scope(runs):
    body = {"report": [{"source_ref": "other-model/psf__requests-2317", "reward": 1}]}
    for role in ("trainer", "researcher", None):
        response = client_for(person(f"u-{role}", role)).post(URL, body, format="json")
        assert response.status_code == 403, role
    user = person("scoped", "curator")
    reader = client_for(user, f"Bearer {token_issue(user=user, name='r', scopes=['trajectories:read']).key}")
    assert reader.post(URL, body, format="json").status_code == 403
    curating = client_for(user, f"Bearer {token_issue(user=user, name='c', scopes=['trajectories:curate']).key}")
    assert curating.post(URL, body, format="json").status_code == 200
    assert not CurationEvent.objects.exclude(actor=user).exists()
