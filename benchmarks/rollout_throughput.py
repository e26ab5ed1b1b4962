"""Rollout throughput end to end on the full stack, and Trove's own overhead per rollout.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python benchmarks/rollout_throughput.py \
        [--rollouts 200] [--workers 2] [--concurrency 1] [--query-sample 3] [--keep-db]

What runs: a scratch Postgres database (created for the run, dropped after), Redis as the Celery broker and
the proxy's record stream, `--workers` real `celery worker` processes of the rollouts' queue (threads pool,
`--concurrency` slots each), `celery beat` (the proxy's record ingest every second, the reconciler, the reaper)
and a worker of one slot for beat's queue (with `--shared-periodic`, none: the rollout workers take beat's
tasks too, as a worker started without -Q does), the recording
proxy (in this process, recording on), the offline demo model, and local bubblewrap sandboxes (single-use,
created on demand by each rollout: a cold claim). One uniform job of `--rollouts` rollouts over the demo tasks (10
tasks x 20 samples by default), with the built-in harness, submitted through `job_create` and enqueued after
commit, exactly as the API does.

Where the time goes, per rollout, from the runner's own clock (Rollout.timings, workers/rollout_runner.py):
`model_ms` in model calls (through the proxy), `sandbox_ms` the commands' own run time (setup, the agent's
commands, the diff, the evaluation's preparation) and `eval_ms` the evaluation command's, both as the agent
measured them inside the sandbox (ExecResult.duration_ms), `total_ms` from the start of `rollout_run` to the
rollout's final write.

trove_overhead_ms_per_rollout = runner_overhead_ms + dispatch_idle_ms: everything that is not the model, the
commands' own run time or the evaluation, where
- runner_overhead_ms is the mean over rollouts of total_ms - model_ms - sandbox_ms - eval_ms. It is given
  apart in three parts: exec_round_trip_ms (each exec's wall time past the command's own: the fence check,
  the exec log, the agent protocol), sandbox_lifecycle_ms (the cold claim that creates the single-use
  sandbox and the release that destroys it: bubblewrap, the agent's start, the rows' transitions) and
  bookkeeping_ms (the rest: claiming the rollout and the lease, opening the trajectory, writing files into
  the sandbox, recording steps, waiting for the proxy's records, finishing);
- dispatch_idle_ms is the worker-slot time lost between rollouts while work was waiting: integrated over the
  span from the job's creation to the last rollout's start (every rollout is queued from the start, so the
  queue is never empty then), the number of idle slots (slots minus rollouts between started_at and
  finished_at), divided by the number of rollouts. It covers Celery's delivery, the task's start and end,
  the ack, and the claim of the rollout row; queue wait while every slot was busy is not overhead and is not
  counted.
Target: trove_overhead_ms_per_rollout under 50. overhead_without_lifecycle_ms (the same less
sandbox_lifecycle_ms) is beside it: a warm fleet takes the create off the rollout's path, and
benchmarks/sandbox_lifecycle.py measures create and destroy on their own.

queries_per_rollout: the database queries the runner makes for one rollout (its own thread, not the
proxy's writer or the heartbeat thread), counted on `--query-sample` rollouts run in this process after the
job, with the same proxy and model.

The last line printed is one JSON object: rollouts, seconds, rollouts_per_s, slots,
trove_overhead_ms_per_rollout, overhead_without_lifecycle_ms, runner_overhead_ms, runner_overhead_p50_ms,
exec_round_trip_ms, sandbox_lifecycle_ms, bookkeeping_ms, dispatch_idle_ms, model_ms, sandbox_ms, eval_ms,
total_ms (means per rollout), statuses, success_rate, queries_per_rollout, query_ms_per_rollout, load_avg.

    quick: .venv/bin/python benchmarks/rollout_throughput.py --rollouts 40 --query-sample 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
TASKS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=200)
    # One slot per core (the sandboxes' commands are CPU work): 2 worker processes of 1 slot on a 2-core box.
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--query-sample", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--keep-db", action="store_true", help="keep the scratch database to look at afterwards")
    parser.add_argument("--shared-periodic", action="store_true",
                        help="the rollout workers also take beat's periodic tasks (a worker started without -Q); "
                             "default: a worker of one slot for the periodic queue alone")
    args = parser.parse_args()
    # Before the settings are read: the periodic queue's name follows the rollouts' (webapp/settings.py).
    os.environ["TROVE_CELERY_QUEUE"] = f"trove-bench-{uuid.uuid4().hex[:8]}"
    os.environ.pop("TROVE_CELERY_PERIODIC_QUEUE", None)
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        sys.exit("benchmarks/rollout_throughput.py runs the full stack: set DATABASE_URL=postgres://... and REDIS_URL")
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_rollouts")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    root = Path(tempfile.mkdtemp(prefix="trove-bench-sbx-", dir="/tmp"))
    root.chmod(0o711)
    try:
        figures = run(args, root)
    finally:
        connection.close()
        if not args.keep_db:
            connection.creation.destroy_test_db(name, verbosity=0)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))


def run(args: argparse.Namespace, root: Path) -> dict:
    from django.conf import settings

    from webapp.celery import app as celery_app
    from workers.sandboxes.local import LocalBackend
    from workers.sandboxes.registry import set_backend
    from workers.stack import start_demo_model, start_proxy

    settings.TROVE_SANDBOX_ROOT = root
    set_backend("local", LocalBackend(root=root))
    model_url, stop_model = start_demo_model()
    proxy, sink = start_proxy(host="127.0.0.1", port=0)
    settings.TROVE_PROXY_PUBLIC_URL = proxy.base_url
    queue, periodic = celery_app.conf.task_default_queue, settings.TROVE_CELERY_PERIODIC_QUEUE
    rollout_queues = f"{queue},{periodic}" if args.shared_periodic else queue
    workers = [start_celery(rollout_queues, proxy.base_url, root, index,
                            ["worker", "-P", "threads", "-c", str(args.concurrency)]) for index in range(args.workers)]
    if not args.shared_periodic:
        workers.append(start_celery(periodic, proxy.base_url, root, args.workers, ["worker", "-P", "threads", "-c", "1"]))
    workers.append(start_celery(queue, proxy.base_url, root, args.workers + 1, ["beat", "-s", str(root / ".beat")]))
    try:
        job, seconds = run_job(args, model_url)
        figures = summarise(job, seconds, slots=args.workers * args.concurrency)
    finally:
        for worker in workers:
            stop_worker(worker)
    try:
        figures.update(count_queries(job, model_url, args.query_sample))
    finally:
        terminate_sandboxes()
        sink.close()
        proxy.stop()
        stop_model()
    figures["load_avg"] = round(os.getloadavg()[0], 2)
    return figures


def start_celery(queues: str, proxy_url: str, root: Path, index: int, command: list[str]) -> subprocess.Popen:
    """A `celery worker` (of `queues`, comma-separated) or `celery beat` process on this run's database, broker
    queues, proxy and sandboxes."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    env = dict(os.environ, DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
               REDIS_URL=settings.REDIS_URL or "", TROVE_PROXY_PUBLIC_URL=proxy_url,
               TROVE_SANDBOX_ROOT=str(root), LOG_LEVEL="WARNING", TROVE_LOG_LEVEL="WARNING")
    env.setdefault("SECRET_KEY", "trove-bench-secret")
    log_path = root / f".celery-{index}.log"
    worker = command[0] == "worker"
    options = ["-Q", queues, "--without-heartbeat", "--without-mingle", "--without-gossip",
               "-n", f"{settings.CELERY_TASK_DEFAULT_QUEUE}-{index}@%h"] if worker else []
    process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "webapp", *command, *options, "-l", "INFO"],
                               cwd=REPO, env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    ready = b"ready." if worker else b"beat: Starting"
    deadline = time.monotonic() + 60
    while ready not in log_path.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log_path.read_text()[-3000:])
        time.sleep(0.2)
    return process


def stop_worker(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def run_job(args: argparse.Namespace, model_url: str):
    from webapp.rollouts.models import RolloutJob
    from webapp.rollouts.services import job_create
    from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint, seed_demo_task_set, seed_local_fleet
    from workers.tasks.rollouts import enqueue_rollout

    task_set = seed_demo_task_set()
    keys = list(task_set.tasks.order_by("key").values_list("key", flat=True))[:TASKS]
    samples = -(-args.rollouts // len(keys))
    fleet = seed_local_fleet(name="bench", min_warm=0, max_warm=0, max_total=args.workers * args.concurrency * 2)
    started = time.perf_counter()
    job = job_create(task_set=task_set, fleet=fleet, endpoint=seed_demo_endpoint(model_url), model_name=DEMO_MODEL_NAME,
                     samples_per_task=samples, task_keys=keys, max_steps=20, enqueue=enqueue_rollout,
                     concurrency=args.workers * args.concurrency)
    deadline = time.monotonic() + args.timeout
    while True:
        job.refresh_from_db()
        if job.status == RolloutJob.Status.COMPLETED:
            return job, time.perf_counter() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job.pk} did not complete in {args.timeout}s")
        time.sleep(0.5)


def summarise(job, seconds: float, *, slots: int) -> dict:
    rollouts = list(job.rollouts.all())
    timings = [r.timings for r in rollouts if r.timings.get("total_ms")]
    overhead = [t["total_ms"] - t["model_ms"] - t["sandbox_ms"] - t["eval_ms"] for t in timings]
    runner_overhead = statistics.fmean(overhead)
    round_trips = statistics.fmean(t["exec_wall_ms"] - t["sandbox_ms"] - t["eval_ms"] for t in timings)
    lifecycle = statistics.fmean(t["sandbox_lifecycle_ms"] for t in timings)
    idle = dispatch_idle_ms(job.created_at, rollouts, slots) / len(rollouts)
    statuses: dict[str, int] = {}
    for rollout in rollouts:
        statuses[rollout.status] = statuses.get(rollout.status, 0) + 1
    return {
        "rollouts": len(rollouts),
        "seconds": round(seconds, 2),
        "rollouts_per_s": round(len(rollouts) / seconds, 3),
        "slots": slots,
        "trove_overhead_ms_per_rollout": round(runner_overhead + idle, 1),
        "overhead_without_lifecycle_ms": round(runner_overhead + idle - lifecycle, 1),
        "runner_overhead_ms": round(runner_overhead, 1),
        "runner_overhead_p50_ms": round(statistics.median(overhead), 1),
        "exec_round_trip_ms": round(round_trips, 1),
        "sandbox_lifecycle_ms": round(lifecycle, 1),
        "bookkeeping_ms": round(runner_overhead - round_trips - lifecycle, 1),
        "dispatch_idle_ms": round(idle, 1),
        **{key: round(statistics.fmean(t[key] for t in timings), 1)
           for key in ("model_ms", "sandbox_ms", "eval_ms", "total_ms")},
        "statuses": statuses,
        "success_rate": round(statuses.get("succeeded", 0) / len(rollouts), 3),
    }


def dispatch_idle_ms(created_at, rollouts: list, slots: int) -> float:
    """Idle worker-slot milliseconds from the job's creation to the last start (see the module docstring)."""
    end = max(r.started_at for r in rollouts)
    events = sorted([(r.started_at, 1) for r in rollouts] + [(r.finished_at, -1) for r in rollouts if r.finished_at < end])
    idle, running, at = 0.0, 0, created_at
    for when, change in events:
        idle += max(0, slots - running) * (when - at).total_seconds() * 1000
        running, at = running + change, when
    return idle


def count_queries(job, model_url: str, n: int) -> dict:
    """Run `n` more rollouts of the job's first task in this process, counting the runner thread's queries
    and the time they took (queries_per_rollout, query_ms_per_rollout)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.rollouts.services import job_create
    from workers.rollout_runner import rollout_run

    extra = job_create(task_set=job.task_set, fleet=job.fleet, endpoint=job.endpoint, model_name=job.model_name,
                       samples_per_task=n, task_keys=[job.rollouts.first().task.key], max_steps=20,
                       enqueue=lambda rollout_id: None)
    counts, seconds = [], []
    for rollout in extra.rollouts.all():
        with CaptureQueriesContext(connection) as captured:
            rollout_run(rollout_id=rollout.pk, worker="bench")
        counts.append(len(captured.captured_queries))
        seconds.append(sum(float(query["time"]) for query in captured.captured_queries))
    return {"queries_per_rollout": round(statistics.fmean(counts), 1),
            "query_ms_per_rollout": round(statistics.fmean(seconds) * 1000, 1)}


def terminate_sandboxes() -> None:
    from workers.fleet_ops import sandboxes_terminate_all

    sandboxes_terminate_all(backend_kind="local", reason="benchmark over")


if __name__ == "__main__":
    main()
