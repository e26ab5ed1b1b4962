"""A job's concurrency holds whatever the number of workers: several real `celery worker` processes on Redis
and Postgres, each with several slots, run a job of many rollouts with the demo model in bubblewrap
sandboxes, while every rollout's message is also sent a second time (as a redelivery or the reaper's
re-send would) and the reaper runs. The stored started_at / finished_at intervals never overlap beyond the
limit, every rollout finishes on its first attempt, and the job page shows the limit and a running count
that never exceeds it."""

from __future__ import annotations

import re

import pytest
from django.conf import settings as django_settings

from tests.integration.test_rollout_failures import WorkerProcess, job_completed, shared_queue, wait_until
from webapp.rollouts.models import Rollout, RolloutJob
from webapp.rollouts.services import job_create
from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint
from workers.tasks.rollouts import enqueue_rollout, reap_stale_rollouts

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
__all__ = ["shared_queue"]  # a fixture, used by name below
TASKS = ["calc_expr", "roman_numerals", "slugify"]
WORKERS, SLOTS_PER_WORKER = 3, 2
RUNNING_ON_PAGE = re.compile(r'id="running">(\d+) of at most (\d+)<')


def max_overlap(intervals: list[tuple]) -> int:
    """The most intervals open at one instant. A start at the very instant of a finish does not overlap it."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = top = 0
    for _, change in events:  # at equal times the finish (-1) sorts first
        running += change
        top = max(top, running)
    return top


def start_workers(tmp_path, sandbox_root, proxy, queue: str, handoff: str = "1") -> list[WorkerProcess]:
    workers: list[WorkerProcess] = []
    try:
        for index in range(WORKERS):
            workers.append(WorkerProcess(broker_url=django_settings.REDIS_URL, queue=queue,
                                         log_path=tmp_path / f"worker-{index}.log", sandbox_root=sandbox_root,
                                         proxy_url=proxy.base_url, concurrency=SLOTS_PER_WORKER,
                                         TROVE_ROLLOUT_HANDOFF=handoff))
    except BaseException:
        for worker in workers:
            worker.stop()
        raise
    return workers


# Without the hand-off every start comes from a message, so the starts race across the processes; with it, a
# finishing task starts the job's next rollout itself, while the duplicates and the reaper's re-sends race it.
@pytest.mark.parametrize(("limit", "samples", "handoff"), [(1, 3, "0"), (2, 4, "0"), (2, 4, "1")])
def test_a_jobs_concurrency_holds_across_worker_processes_and_every_rollout_finishes(
    proxy, local_backend, sandbox_root, demo_task_set, demo_fleet, demo_model_url, shared_queue, tmp_path, settings,
    admin_client, limit, samples, handoff
):
    settings.TROVE_ROLLOUT_RESEND_S = 0  # the reaper below re-sends every queued rollout whose message went out
    workers = start_workers(tmp_path, sandbox_root, proxy, shared_queue, handoff)
    shown: list[tuple[int, int]] = []
    running_in_db: list[int] = []
    try:
        job = job_create(task_set=demo_task_set, fleet=demo_fleet, endpoint=seed_demo_endpoint(demo_model_url),
                         model_name=DEMO_MODEL_NAME, samples_per_task=samples, task_keys=TASKS, max_steps=12,
                         concurrency=limit, enqueue=enqueue_rollout)
        for rollout_id in job.rollouts.values_list("pk", flat=True):
            enqueue_rollout(rollout_id)  # a second message for every rollout: idle slots race to start them

        def watch() -> bool:
            page = admin_client.get(f"/jobs/{job.pk}/").content.decode()
            running, at_most = map(int, RUNNING_ON_PAGE.search(page).groups())
            shown.append((running, at_most))
            running_in_db.append(Rollout.objects.filter(job=job, status=Rollout.Status.RUNNING).count())
            reap_stale_rollouts()  # the reaper's pass: re-sends and sends while the job runs
            return job_completed(job)

        wait_until(watch, timeout=900, what="the job to complete", poll=0.3)
    finally:
        for worker in workers:
            worker.stop()

    rollouts = list(job.rollouts.all())
    assert len(rollouts) == samples * len(TASKS)
    assert {r.status for r in rollouts} <= {Rollout.Status.SUCCEEDED, Rollout.Status.FAILED}, \
        [(r.pk, r.status, r.error) for r in rollouts]
    assert {r.attempt for r in rollouts} == {1}, "a deferred start is not an attempt"
    overlap = max_overlap([(r.started_at, r.finished_at) for r in rollouts])
    assert overlap == limit, f"at most {limit} at once (and that many at some point), stored intervals say {overlap}"
    assert {at_most for _, at_most in shown} == {limit}, "the job page shows the limit"
    assert max(running for running, _ in shown) <= limit and max(running_in_db) <= limit
    logs = "".join(worker.log_path.read_text() for worker in workers)
    assert "deferred: job" in logs, "some start found the job full and waited for a slot (the limit was tested)"
    processes = {r.worker.split(":")[2] for r in rollouts}  # execution ids: rollout:<host>:<pid>:<nonce>
    if handoff == "0":
        assert len(processes) > 1, "the rollouts ran in more than one worker process"
    job.refresh_from_db()
    assert job.status == RolloutJob.Status.COMPLETED
