"""Real harnesses in Trove: per preset, a job of rollouts against the demo model, and Trove's overhead.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python benchmarks/harness_rollouts.py \
        [--presets mini-swe-agent,opencode,codex,claude-code,qwen-code,gemini-cli] [--rollouts 20] \
        [--concurrency 2]

What runs: a scratch Postgres database (created for the run, dropped after), the recording proxy in this
process on TCP and on its Unix socket, the offline demo model (in every protocol), and local bubblewrap
sandboxes on a proxy-only template with the installed bundles mounted (`manage.py harness install` first:
a preset whose bundle is missing is reported, not installed). Per preset one uniform job of `--rollouts`
rollouts over the demo tasks, run by `rollout_run` on `--concurrency` threads, as a Celery worker would.

Figures per preset, means per rollout, from the runner's clock (Rollout.timings) and the harness's step:
- wall_ms: the rollout's total_ms, from the start of rollout_run to its final write;
- harness_ms: the harness command's own run time in the sandbox (its step's duration, as the in-sandbox
  agent measured it), which holds the model's time (model_ms, the proxy's record of each call) and the
  harness's own work;
- eval_ms: the evaluation command's run time;
- trove_overhead_ms = wall_ms - harness_ms - eval_ms: everything else (claiming the rollout and a cold
  sandbox, setting the workspace up, staging the instruction, exec round trips, collecting the native logs,
  recording, releasing). Its share of the wall time is overhead_fraction; target under 0.05.
  overhead_without_lifecycle_ms leaves out the sandbox's create and destroy, which a warm fleet takes off
  the rollout's path (benchmarks/sandbox_lifecycle.py measures them).

The last line printed is one JSON object: {"presets": {name: figures}, "target_overhead_fraction": 0.05,
"rollouts_per_preset", "concurrency", "load_avg"}.

    quick (all six presets, 4 rollouts each, 150 s wall time): .venv/bin/python benchmarks/harness_rollouts.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
MODEL = "trove-demo-stand-in"
TARGET_OVERHEAD_FRACTION = 0.05
QUICK_ROLLOUTS, QUICK_WALL_TIME_S = 4, 150


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="mini-swe-agent,opencode,codex,claude-code,qwen-code,gemini-cli")
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--wall-time", type=int, default=300,
                        help="each rollout's wall-time budget, s (a harness with no turn limit runs a wandering "
                             "demo sample to it)")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ROLLOUTS} rollouts per preset and a {QUICK_WALL_TIME_S} s wall time")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.wall_time = QUICK_ROLLOUTS, QUICK_WALL_TIME_S
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql" or not settings.REDIS_URL:
        sys.exit("benchmarks/harness_rollouts.py runs on the full stack: set DATABASE_URL=postgres://... and REDIS_URL")
    name = os.environ.get("TROVE_BENCH_DATABASE_NAME", "trove_bench_harnesses")
    connection.settings_dict["TEST"]["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    root = Path(tempfile.mkdtemp(prefix="trove-bench-sbx-", dir="/tmp"))
    root.chmod(0o711)
    socket_dir = Path(tempfile.mkdtemp(prefix="trove-bench-proxy-", dir="/tmp"))
    socket_dir.chmod(0o755)
    try:
        figures = run(args, root, str(socket_dir / "proxy.sock"))
    finally:
        connection.close()
        if not args.keep_db:
            connection.creation.destroy_test_db(name, verbosity=0)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(socket_dir, ignore_errors=True)
    print(json.dumps(figures))


def run(args: argparse.Namespace, root: Path, socket_path: str) -> dict:
    from django.conf import settings

    from workers.demo.model import serve_in_thread
    from workers.sandboxes.local import LocalBackend
    from workers.sandboxes.registry import set_backend
    from workers.stack import start_proxy

    settings.TROVE_SANDBOX_ROOT = root
    set_backend("local", LocalBackend(root=root, bundle_dir=settings.TROVE_HARNESS_DIR))
    model_url, stop_model = serve_in_thread("127.0.0.1", 0)
    proxy, sink = start_proxy(host="127.0.0.1", port=0, unix_path=socket_path)
    settings.TROVE_PROXY_PUBLIC_URL, settings.TROVE_PROXY_SOCKET = proxy.base_url, socket_path
    results: dict[str, dict] = {}
    try:
        for name in [part.strip() for part in args.presets.split(",") if part.strip()]:
            print(f"{name}: {args.rollouts} rollouts ...", file=sys.stderr, flush=True)
            results[name] = run_preset(name, model_url.rstrip("/"), args)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    finally:
        sink.close()
        proxy.stop()
        stop_model()
    return {"presets": results, "target_overhead_fraction": TARGET_OVERHEAD_FRACTION,
            "rollouts_per_preset": args.rollouts, "concurrency": args.concurrency, "quick": args.quick,
            "load_avg": round(os.getloadavg()[0], 2)}


def run_preset(name: str, model_url: str, args: argparse.Namespace) -> dict:
    from django.conf import settings

    from workers.harness.presets import resolve
    from workers.harness.presets.bundles import bundle_installed

    preset, version = resolve(name)
    if not bundle_installed(settings.TROVE_HARNESS_DIR, preset, version):
        return {"error": f"not installed: run manage.py harness install {name}@{version}"}
    job = make_job(preset, version, model_url, args)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(run_one, job.rollouts.values_list("pk", flat=True)))
    return summarise(job, time.perf_counter() - started)


def make_job(preset, version: str, model_url: str, args: argparse.Namespace):
    from webapp.fleets import services as fleet_services
    from webapp.rollouts.endpoints import endpoint_register
    from webapp.rollouts.services import job_create
    from workers.seed import seed_demo_task_set

    base = model_url.removesuffix("/v1")
    endpoint = endpoint_register(name=f"bench-{preset.name}-{uuid.uuid4().hex[:6]}",
                                 base_url=base + ("/v1beta" if preset.protocol == "gemini" else "/v1"),
                                 protocol=preset.protocol, model_names=[MODEL], allow_private_network=True)
    template = fleet_services.template_create(name=f"bench-{uuid.uuid4().hex[:6]}", cpu=1.0, memory_mb=2048,
                                              pids=1024, network="proxy-only", max_lifetime_s=3600, idle_timeout_s=900)
    fleet = fleet_services.fleet_create(name=f"bench-{uuid.uuid4().hex[:6]}", template=template, backend="local",
                                        min_warm=0, max_warm=0, max_total=args.concurrency * 2)
    task_set = seed_demo_task_set()
    keys = list(task_set.tasks.order_by("key").values_list("key", flat=True))
    keys = keys[: min(len(keys), args.rollouts)]
    samples = -(-args.rollouts // len(keys))
    job = job_create(task_set=task_set, fleet=fleet, endpoint=endpoint, model_name=MODEL, samples_per_task=samples,
                     task_keys=keys, max_steps=20, wall_time_s=args.wall_time, harness=f"{preset.name}@{version}",
                     concurrency=args.concurrency, enqueue=lambda rollout_id: None)
    extra = list(job.rollouts.order_by("pk").values_list("pk", flat=True))[args.rollouts:]
    job.rollouts.filter(pk__in=extra).delete()  # exactly --rollouts
    return job


def run_one(rollout_id: int) -> None:
    from django.db import connection

    from workers.rollout_runner import rollout_run

    try:
        rollout_run(rollout_id=rollout_id, worker=f"bench-{os.getpid()}")
    finally:
        connection.close()


def summarise(job, seconds: float) -> dict:
    from experience.models import Step

    rollouts = list(job.rollouts.select_related("trajectory"))
    harness_ms = dict(Step.objects.filter(trajectory__in=[r.trajectory_id for r in rollouts], kind="command",
                                          payload__harness=job.harness).values_list("trajectory_id", "duration_ms"))
    rows = [(r.timings, harness_ms.get(r.trajectory_id) or 0.0) for r in rollouts if r.timings.get("total_ms")]
    wall = statistics.fmean(t["total_ms"] for t, _ in rows)
    harness = statistics.fmean(h for _, h in rows)
    evaluation = statistics.fmean(t["eval_ms"] for t, _ in rows)
    lifecycle = statistics.fmean(t["sandbox_lifecycle_ms"] for t, _ in rows)
    overhead = [t["total_ms"] - h - t["eval_ms"] for t, h in rows]
    statuses: dict[str, int] = {}
    for rollout in rollouts:
        statuses[rollout.status] = statuses.get(rollout.status, 0) + 1
    mean_overhead = statistics.fmean(overhead)
    return {
        "harness": job.harness, "rollouts": len(rollouts), "seconds": round(seconds, 1),
        "wall_ms": round(wall, 1), "harness_ms": round(harness, 1),
        "model_ms": round(statistics.fmean(t["model_ms"] for t, _ in rows), 1), "eval_ms": round(evaluation, 1),
        "trove_overhead_ms": round(mean_overhead, 1),
        "trove_overhead_p50_ms": round(statistics.median(overhead), 1),
        "overhead_fraction": round(mean_overhead / wall, 4),
        "overhead_without_lifecycle_ms": round(mean_overhead - lifecycle, 1),
        "overhead_without_lifecycle_fraction": round((mean_overhead - lifecycle) / wall, 4),
        "sandbox_lifecycle_ms": round(lifecycle, 1),
        "model_calls_per_rollout": round(statistics.fmean(r.steps or 0 for r in rollouts), 1),
        "statuses": statuses,
        "success_rate": round(statuses.get("succeeded", 0) / len(rollouts), 3),
    }


if __name__ == "__main__":
    main()
