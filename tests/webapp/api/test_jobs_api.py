"""The jobs API with a token: submit, status, the finished-rollouts cursor, cancel, re-run, task sets."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.webapp.rollouts.jobs_factories import (  # noqa: F401 (celery_queue is a fixture)
    celery_queue,
    drive,
    finish,
    make_endpoint,
    make_fleet,
    make_job,
    make_task_set,
)
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import Rollout, RolloutJob, TaskSet

R = Rollout.Status
pytestmark = pytest.mark.django_db
SECRET = "sk-live-never-show-me-4f1c"


@pytest.fixture
def api():
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["trainer"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    client.user = user
    return client


def submit_body(task_set: TaskSet, fleet, **fields) -> dict:
    if "endpoint" not in fields:
        fields["endpoint"] = make_endpoint(model_names=["policy-7"]).name
    return {"task_set": task_set.name, "fleet": fleet.name, "model_name": "policy-7", **fields}


def test_a_trainer_submits_a_job_by_names_and_its_rollouts_are_enqueued(
    api, celery_queue, monkeypatch, django_capture_on_commit_callbacks  # noqa: F811 (a fixture)
):
    monkeypatch.setenv("TROVE_MODEL_KEY_POLICY", SECRET)
    task_set, fleet = make_task_set(["a", "b", "c"]), make_fleet()
    endpoint = make_endpoint(name="policy-server", model_names=["policy-7"], key_ref="env:TROVE_MODEL_KEY_POLICY")

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/jobs/", submit_body(
            task_set, fleet, endpoint="policy-server", samples_per_task=4, sampling="adaptive",
            adaptive_first_round=2, max_steps=12, concurrency=3, name="run-1"), format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    job = RolloutJob.objects.get(pk=body["id"])
    assert (job.task_set, job.fleet, job.created_by, job.endpoint) == (task_set, fleet, api.user, endpoint)
    assert (body["endpoint"], body["model_name"]) == ("policy-server", "policy-7")
    assert (body["name"], body["status"], body["sampling"], body["max_steps"], body["concurrency"]) == (
        "run-1", "queued", "adaptive", 12, 3)
    assert body["progress"]["issued"] == 6 and body["progress"]["total"] == 12
    assert body["budget"]["total"] == 12 and [row["task"] for row in body["budget"]["per_task"]] == ["a", "b", "c"]
    assert body["rollouts_url"].endswith(f"/api/v1/jobs/{job.pk}/rollouts/")
    messages = celery_queue()
    assert [m["task"] for m in messages] == ["trove.rollouts.run"] * 3, "as many sent as the job's concurrency"
    sent = sorted(int(m["argsrepr"].strip("(),")) for m in messages)
    assert sent == sorted(job.rollouts.filter(sample_index=0).values_list("pk", flat=True)), "first samples first"
    assert SECRET not in response.content.decode()


@pytest.mark.parametrize(("change", "status", "field"), [
    ({"task_set": "nope"}, 404, "task_set"),
    ({"fleet": "nope"}, 404, "fleet"),
    ({"endpoint": "nope"}, 404, "endpoint"),
    ({"model_name": "a-model-the-endpoint-does-not-serve"}, 400, "model_name"),
    ({"api_key_ref": "sk-pasted-key"}, 400, "api_key_ref"),
    ({"api_key": "sk-pasted-key"}, 400, "api_key"),
    ({"samples_per_task": 0}, 400, "samples_per_task"),
    ({"sampling": "greedy"}, 400, "sampling"),
    ({"model_base_url": "http://127.0.0.1:8000/"}, 400, "model_base_url"),
    ({"task_keys": ["a", "zzz"]}, 400, "task_keys"),
])
def test_bad_submissions_get_a_4xx_naming_the_field_and_create_nothing(api, change, status, field):
    body = submit_body(make_task_set(["a"]), make_fleet()) | change

    response = api.post("/api/v1/jobs/", body, format="json")

    assert response.status_code == status
    data = response.json()
    assert data.get("field") == field or field in data, data
    assert "sk-pasted-key" not in response.content.decode()
    assert not RolloutJob.objects.exists()


def test_the_status_shows_progress_and_the_budget_spent_per_task(api):
    job = make_job(["easy", "mixed"], sampling="adaptive", samples_per_task=3, adaptive_first_round=2, concurrency=1)
    drive(job, lambda key, index: R.SUCCEEDED if key == "easy" or index % 2 else R.FAILED)

    body = api.get(f"/api/v1/jobs/{job.pk}/").json()

    assert body["status"] == "completed"
    assert body["progress"] | {"by_status": None} == {
        "total": 6, "issued": 6, "finished": 6, "running": 0, "queued": 0, "concurrency": 1, "percent": 100,
        "success_rate": 0.6667, "by_status": None}
    rows = {row["task"]: row for row in body["budget"]["per_task"]}
    assert (rows["easy"]["spent"], rows["easy"]["stopped_because"]) == (2, "always passed")
    assert (rows["mixed"]["spent"], rows["mixed"]["succeeded"], rows["mixed"]["failed"]) == (4, 2, 2)


def test_a_trainer_pages_through_finished_rollouts_with_the_cursor(api):
    job = make_job(["a", "b"], samples_per_task=3)
    rollouts = list(job.rollouts.order_by("id"))
    for rollout in rollouts[:3]:
        finish(rollout.pk, R.SUCCEEDED)

    first = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?limit=2").json()
    second = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?after={first['next_cursor']}&limit=2").json()
    empty = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?after={second['next_cursor']}").json()

    assert [r["id"] for r in first["results"]] == [r.pk for r in rollouts[:2]] and first["has_more"] is True
    assert [r["id"] for r in second["results"]] == [rollouts[2].pk] and second["has_more"] is False
    assert (empty["results"], empty["next_cursor"], empty["done"]) == ([], second["next_cursor"], False)
    row = first["results"][0]
    assert (row["task"], row["sample_index"], row["status"], row["reward"], row["cursor"]) == ("a", 0, "succeeded", 1.0, "1")

    for rollout in reversed(rollouts[3:]):
        finish(rollout.pk, R.FAILED)
    last = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?after={second['next_cursor']}").json()
    assert [r["id"] for r in last["results"]] == [r.pk for r in reversed(rollouts[3:])], "in the order they finished"
    assert last["done"] is True and last["job_status"] == "completed"


def test_a_finished_rollout_links_to_its_trajectory(api):
    from experience.models import Trajectory

    job = make_job(["a"])
    rollout = job.rollouts.get()
    trajectory = Trajectory.objects.create(source="rollout", source_ref=f"rollout:{rollout.pk}", task_key="a")
    Rollout.objects.filter(pk=rollout.pk).update(trajectory=trajectory)
    finish(rollout.pk, R.SUCCEEDED)

    row = api.get(f"/api/v1/jobs/{job.pk}/rollouts/").json()["results"][0]

    assert row["trajectory_id"] == trajectory.pk
    assert row["trajectory_url"] == f"http://testserver/trajectories/{trajectory.pk}/"


def test_the_cursor_must_be_a_number(api):
    job = make_job(["a"])

    response = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?after=yesterday")

    assert response.status_code == 400 and "after" in response.json()


def test_the_rollouts_page_costs_a_fixed_number_of_queries(api, django_assert_num_queries):
    job = make_job(["a", "b", "c"], samples_per_task=4)
    for rollout in job.rollouts.all():
        finish(rollout.pk, R.SUCCEEDED)

    with django_assert_num_queries(3):  # the token, the job, the page
        response = api.get(f"/api/v1/jobs/{job.pk}/rollouts/?limit=50")
    assert len(response.json()["results"]) == 12


def test_the_jobs_list_costs_a_fixed_number_of_queries(api, django_assert_num_queries):
    for _ in range(4):
        make_job(["a", "b"], samples_per_task=2)

    with django_assert_num_queries(2):  # the token, the page of jobs with their counts
        response = api.get("/api/v1/jobs/")
    jobs = response.json()["results"]
    assert len(jobs) == 4 and jobs[0]["n_rollouts"] == 4 and jobs[0]["id"] > jobs[-1]["id"]


def test_cancel_with_a_token_stops_the_job(api):
    job = make_job(["a", "b"], samples_per_task=2)

    response = api.post(f"/api/v1/jobs/{job.pk}/cancel/")

    assert response.status_code == 200
    assert response.json()["cancelled"] == 4 and response.json()["job"]["status"] == "cancelled"
    assert set(job.rollouts.values_list("status", flat=True)) == {R.CANCELLED}


def test_cancel_one_rollout_and_a_finished_one_is_a_conflict(api):
    job = make_job(["a"], samples_per_task=2)
    first, second = job.rollouts.order_by("id")
    finish(second.pk, R.SUCCEEDED)

    assert api.post(f"/api/v1/rollouts/{first.pk}/cancel/").json()["status"] == "cancelled"
    again = api.post(f"/api/v1/rollouts/{second.pk}/cancel/")
    assert again.status_code == 409 and again.json()["field"] == "status"


def test_rerun_failed_through_the_api(api):
    job = make_job(["a"], samples_per_task=2)
    running = api.post(f"/api/v1/jobs/{job.pk}/rerun-failed/", {}, format="json")
    assert running.status_code == 409
    drive(job, lambda key, index: R.FAILED if index else R.SUCCEEDED)

    response = api.post(f"/api/v1/jobs/{job.pk}/rerun-failed/", {}, format="json")

    assert response.status_code == 201
    created = response.json()["created"]
    assert [(r["task"], r["sample_index"], r["status"]) for r in created] == [("a", 2, "queued")]
    assert response.json()["job"]["status"] == "running"


def test_the_api_key_itself_never_appears_in_any_response(
    api, monkeypatch, django_capture_on_commit_callbacks, celery_queue  # noqa: F811 (a fixture)
):
    monkeypatch.setenv("TROVE_MODEL_KEY_POLICY", SECRET)
    task_set, fleet = make_task_set(["a"]), make_fleet()
    make_endpoint(name="keyed", model_names=["policy-7"], key_ref="env:TROVE_MODEL_KEY_POLICY")
    with django_capture_on_commit_callbacks(execute=True):
        job_id = api.post("/api/v1/jobs/", submit_body(task_set, fleet, endpoint="keyed"),
                          format="json").json()["id"]
    finish(RolloutJob.objects.get(pk=job_id).rollouts.get().pk, R.SUCCEEDED)

    pages = [api.get(url).content.decode() for url in (
        "/api/v1/jobs/", f"/api/v1/jobs/{job_id}/", f"/api/v1/jobs/{job_id}/rollouts/", f"/api/v1/jobs/{job_id}/live/",
        "/api/v1/endpoints/", "/api/v1/endpoints/keyed/")]

    assert all('"endpoint":"keyed"' in page for page in pages[:2])
    assert all("env:TROVE_MODEL_KEY_POLICY" in page for page in pages[4:])  # the reference, for ops to check
    assert not any(SECRET in page for page in pages)
    assert SECRET not in json.dumps(list(RolloutJob.objects.values()), default=str)


def test_without_a_token_the_api_answers_401(api):
    job = make_job(["a"])

    assert APIClient().get(f"/api/v1/jobs/{job.pk}/").status_code == 401
    assert APIClient().post("/api/v1/jobs/", {}, format="json").status_code == 401


def test_an_unknown_job_is_a_404_naming_it(api):
    response = api.get("/api/v1/jobs/999999/")

    assert response.status_code == 404 and response.json() == {
        "error": "not_found", "detail": "job 999999 does not exist", "field": "job_id"}


def test_task_sets_are_uploaded_as_jsonl_and_listed(api):
    lines = "\n".join(json.dumps({"instance_id": f"t{i}", "problem_statement": "p", "eval_command": "true"})
                      for i in range(3))
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("tasks.jsonl", lines.encode(), content_type="application/x-ndjson")
    created = api.post("/api/v1/task-sets/", {"name": "uploaded", "file": upload}, format="multipart")
    as_text = api.post("/api/v1/task-sets/", {"name": "as-text", "jsonl": lines}, format="json")

    assert created.status_code == 201 and created.json()["n_tasks"] == 3 and created.json()["source"] == "jsonl"
    assert as_text.status_code == 201
    listed = api.get("/api/v1/task-sets/").json()["results"]
    assert [(t["name"], t["n_tasks"]) for t in listed] == [("as-text", 3), ("uploaded", 3)]


def test_a_bad_task_set_upload_names_the_line_and_field_and_writes_nothing(api):
    lines = "\n".join([json.dumps({"instance_id": "t1", "problem_statement": "p", "eval_command": "true"}),
                       json.dumps({"instance_id": "t2", "problem_statement": "p"})])

    response = api.post("/api/v1/task-sets/", {"name": "broken", "jsonl": lines}, format="json")

    assert response.status_code == 400
    assert response.json() == {"error": "invalid_task_set", "detail": "line 2: field 'eval_command' missing",
                               "field": "eval_command"}
    assert not TaskSet.objects.exists()


def test_the_schema_documents_the_jobs_endpoints(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for path in ("/api/v1/jobs/", "/api/v1/jobs/{job_id}/", "/api/v1/jobs/{job_id}/rollouts/",
                 "/api/v1/jobs/{job_id}/cancel/", "/api/v1/jobs/{job_id}/rerun-failed/", "/api/v1/task-sets/"):
        assert path in paths
    # The submission body is documented field by field, with what is required.
    body = paths["/api/v1/jobs/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    submit = json.loads(response.content)["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
    assert {"task_set", "fleet", "samples_per_task", "concurrency", "sampling"} <= set(submit["properties"])
    assert {"task_set", "fleet"} <= set(submit["required"])
