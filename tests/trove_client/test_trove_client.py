"""The Python client over real HTTP against a live server: what a training loop does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from tests.webapp.rollouts.jobs_factories import celery_queue, drive, make_endpoint, make_fleet  # noqa: F401 (a fixture)
from trove_client import TroveAPIError, TroveClient
from webapp.access.roles import role_groups_sync
from webapp.rollouts.models import Rollout, RolloutJob

R = Rollout.Status
REPO = Path(__file__).resolve().parents[2]


def tasks_jsonl(keys: list[str]) -> str:
    return "\n".join(json.dumps({"instance_id": k, "problem_statement": f"fix {k}", "eval_command": "true"}) for k in keys)


@pytest.fixture
def trove(live_server, transactional_db, celery_queue):  # noqa: F811 (a fixture)
    user = get_user_model().objects.create_user("trainer")
    user.groups.add(role_groups_sync()["researcher"])  # submits jobs and imports runs
    return TroveClient(live_server.url, Token.objects.create(user=user).key, timeout=10)


def in_background(target, *args) -> threading.Thread:
    def run():
        try:
            target(*args)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_client_imports_without_django():
    code = ("import sys, trove_client; "
            "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery')]; "
            "assert not loaded, loaded")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_trainer_submits_a_job_and_streams_every_finished_rollout_until_it_ends(trove):
    task_set = trove.upload_task_set("client-set", tasks_jsonl(["easy", "mixed"]))
    fleet = make_fleet()
    endpoint = make_endpoint(model_names=["policy"], key_ref="env:TROVE_MODEL_KEY_POLICY")
    assert [e["name"] for e in trove.list_endpoints()] == [endpoint.name]
    job = trove.submit_job(task_set="client-set", fleet=fleet.name, endpoint=endpoint.name, samples_per_task=4,
                           sampling="adaptive", adaptive_first_round=2, concurrency=2)
    assert task_set["n_tasks"] == 2 and job["status"] == "queued"
    assert (job["endpoint"], job["model_name"]) == (endpoint.name, "policy")

    worker = in_background(drive, RolloutJob.objects.get(pk=job["id"]),
                           lambda key, index: R.SUCCEEDED if key == "easy" or index % 2 else R.FAILED)
    seen = list(trove.iter_finished_rollouts(job["id"], poll_interval=0.05, limit=3))
    worker.join(timeout=30)

    in_finish_order = list(Rollout.objects.filter(job_id=job["id"]).order_by("finish_seq").values_list("pk", flat=True))
    assert [r["id"] for r in seen] == in_finish_order, "each rollout once, in the order it finished"
    assert len(seen) == 8 and [r["cursor"] for r in seen] == [str(n) for n in range(1, 9)]
    status = trove.job_status(job["id"])
    assert status["status"] == "completed"
    assert {row["task"]: row["spent"] for row in status["budget"]["per_task"]} == {"easy": 2, "mixed": 6}


def test_a_trainer_resumes_from_its_last_cursor(trove):
    trove.upload_task_set("resume-set", tasks_jsonl(["a"]))
    job = trove.submit_job(task_set="resume-set", fleet=make_fleet().name, endpoint=make_endpoint().name,
                           samples_per_task=3)
    drive(RolloutJob.objects.get(pk=job["id"]), lambda key, index: R.SUCCEEDED)
    first_page = trove.finished_rollouts(job["id"], limit=1)

    rest = list(trove.iter_finished_rollouts(job["id"], after=first_page["next_cursor"], poll_interval=0.05))

    assert [r["cursor"] for r in rest] == ["2", "3"]


def test_cancel_a_job_from_the_client(trove):
    trove.upload_task_set("cancel-set", tasks_jsonl(["a", "b"]))
    job = trove.submit_job(task_set="cancel-set", fleet=make_fleet().name, endpoint=make_endpoint().name,
                           samples_per_task=2)

    cancelled = trove.cancel_job(job["id"])

    assert cancelled["cancelled"] == 4 and trove.job_status(job["id"])["status"] == "cancelled"
    rows = list(trove.iter_finished_rollouts(job["id"], poll_interval=0.05))
    assert {r["status"] for r in rows} == {"cancelled"} and len(rows) == 4


def test_errors_come_back_as_exceptions_naming_the_field(trove, live_server):
    with pytest.raises(TroveAPIError) as missing:
        trove.submit_job(task_set="no-such-set", fleet="x", endpoint="y", model_name="m")
    assert (missing.value.status, missing.value.field) == (404, "task_set")

    with pytest.raises(TroveAPIError) as bad_file:
        trove.upload_task_set("bad", '{"instance_id": "a"}')
    assert bad_file.value.status == 400 and "line 1: field 'problem_statement' missing" in str(bad_file.value)

    with pytest.raises(TroveAPIError) as unauthorised:
        TroveClient(live_server.url, "not-a-token").list_jobs()
    assert unauthorised.value.status == 401


def test_a_curator_labels_stored_runs_from_a_report_dry_run_first(live_server, transactional_db):
    from experience.models import CurationEvent, Trajectory
    from tests.experience.importers.fixture_files import SWE_BENCH_SUMMARY
    from tests.experience.services.store_factories import RunFactory, stored

    stored(*(RunFactory(task_key=task, model="swe-agent-llama-70b", source_ref=task)
             for task in ("django__django-11099", "psf__requests-2317")))
    user = get_user_model().objects.create_user("curator")
    user.groups.add(role_groups_sync()["curator"])
    trove = TroveClient(live_server.url, Token.objects.create(user=user).key, timeout=10)

    dry = trove.label_outcomes(SWE_BENCH_SUMMARY, dry_run=True)
    assert (dry["labelled"], dry["dry_run"], CurationEvent.objects.count()) == (2, True, 0)
    done = trove.label_outcomes(SWE_BENCH_SUMMARY, filter={"model": "swe-agent-llama-70b"})
    assert (done["resolved"], done["unresolved"], done["dry_run"]) == (1, 1, False)
    assert dict(Trajectory.objects.values_list("source_ref", "success")) == {
        "django__django-11099": True, "psf__requests-2317": False}
    with pytest.raises(TroveAPIError) as unmatched:
        trove.label_outcomes([{"task_id": "nobody-1", "reward": 1}])
    assert unmatched.value.status == 400 and unmatched.value.body["unmatched"] == ["nobody-1"]
