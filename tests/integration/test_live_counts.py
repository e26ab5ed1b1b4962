"""Live numbers agree, on the full stack: a real Celery worker process on Redis and Postgres runs a job with
the demo model in bubblewrap sandboxes, through the recording proxy. Again and again while it runs, the
worker is frozen (SIGSTOP: nothing it does reaches the database meanwhile) and every view is read: the job
page, its live feed, the overview, the API's job and jobs list, and for each running rollout its run page
(summary and listed steps) and the API's run. All of them must show the counts the rows give at that moment;
then the worker goes on (SIGCONT)."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager

import pytest
from django.db import connection
from django.db.models import Count

from experience.models import Step
from tests.integration.test_rollout_failures import wait_until
from tests.webapp.rollouts.job_views import job_disagreements, job_rows, run_views
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import job_create
from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint
from workers.tasks.rollouts import enqueue_rollout

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TASKS = ["calc_expr", "roman_numerals", "slugify"]


@contextmanager
def frozen(process):
    """The worker process stopped for the block: its threads (harness, heartbeat, record catch-up) write
    nothing until it goes on. The proxy keeps recording into its Redis stream, which only the worker reads.
    A statement (a COMMIT) the worker sent just before it stopped still runs on the server: the block starts
    once no other session of the database is running one (and the test checks the rows did not move).
    A session waiting on its client (a COPY waiting for rows, a result waiting to be read: the frozen worker
    sends and reads nothing) or on a lock cannot finish meanwhile, so it does not count as running."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not _statements_running(), timeout=60, what="the worker's last statements", poll=0.05)
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def _statements_running() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND state = 'active' "
                       "AND coalesce(wait_event_type, '') NOT IN ('Client', 'Lock')")
        return cursor.fetchone()[0]


def state(job: RolloutJob) -> tuple:
    """What the rows say now: the job's counts and every one of its runs' step count."""
    steps = Step.objects.filter(trajectory__rollout__job=job).values("trajectory_id").annotate(n=Count("id"))
    return tuple(sorted(job_rows(job).items())), tuple(sorted((row["trajectory_id"], row["n"]) for row in steps))


def sweep(client, job: RolloutJob) -> dict:
    """Read every view at one frozen moment; returns what was seen (for the test's own coverage checks)."""
    problems = job_disagreements(client, job)
    runs = {}
    for trajectory_id in Rollout.objects.filter(job=job, status=Rollout.Status.RUNNING).exclude(
            trajectory=None).values_list("trajectory_id", flat=True):
        views = run_views(client, trajectory_id)
        runs[trajectory_id] = views
        truth = views["step rows"]
        problems += [f"run {trajectory_id} {name}: {counts} (rows say {truth})"
                     for name, counts in views.items() if counts != truth]
    return {"problems": problems, "rows": job_rows(job), "runs": runs}


def test_every_view_shows_the_same_counts_at_every_moment_of_a_live_job(
    celery_worker_process, demo_model_url, demo_task_set, demo_fleet, admin_client
):
    job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                     model_name=DEMO_MODEL_NAME, samples_per_task=2, task_keys=TASKS, max_steps=20, concurrency=2,
                     enqueue=enqueue_rollout)
    seen = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with frozen(celery_worker_process):
            job.refresh_from_db()
            before = state(job)
            look = sweep(admin_client, job)
            still = state(job) == before
        if still:  # else a write landed during the look after all: it is not a moment, look again
            assert look["problems"] == [], look["problems"]
            seen.append(look)
        if still and job.status == RolloutJob.Status.COMPLETED:
            break
        time.sleep(0.3)  # let the job move on between looks
    else:
        raise AssertionError(f"job {job.pk} did not complete: {list(job.rollouts.values_list('status', 'error'))}")

    mid_job = [s for s in seen if 0 < s["rows"]["finished"] < s["rows"]["total"]]
    mid_run = [views for s in seen for views in s["runs"].values() if views["step rows"]["steps"] > 0]
    assert mid_job, "some looks caught the job part-way"
    assert mid_run, "some looks caught a rollout part-way, with steps stored"
    assert max(s["rows"]["running"] for s in seen) <= 2
    final = seen[-1]["rows"]
    assert (final["finished"], final["spent"], final["total"]) == (6, 6, 6)
