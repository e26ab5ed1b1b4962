"""Does the baseline value model earn its keep? Best-of-N reranking on the demo store.

The store: a real demo rollout job, as `manage.py demo` runs it — the demo task set (14 small Python
bug-fix tasks) and a local bubblewrap fleet seeded, the embedded stack started (recording proxy, worker,
beat, the offline demo model), then `job_create` with `--samples` runs per task (15: 210 runs). The demo
model is a scripted stand-in for a real model server; its runs succeed or fail by what they did (a decoy
edit, giving up, wandering), and the task's tests decide the reward. The job goes into its own database
(`--database-url`, created if missing); `--reuse` keeps the runs already there (at least 200 are needed).

With only 14 tasks a single split puts two or three tasks in val and in test, so the measurement is
repeated over `--folds` split seeds (each a different assignment of whole tasks to train / val / test,
fractions 0.6 / 0.2 / 0.2): a `value` version is built per seed through the real build service, and
`value_baseline_run` trains on its train rows, measures AUC on its val rows and best-of-N on its test
tasks. No task's runs are ever both trained on and scored in the same fold.

Keys: `auc_val` (mean over folds with both outcomes in val), `bestof4_random`, `bestof4_reranked`,
`bestof4_oracle` (success rate of picking one of 4 runs of a test task: at random, the model's top pick,
any of the 4 solved it; averaged over every test task of every fold), the same for N = 2 and 8, and the
store's size and success rate. Target: reranked clearly above random. The last line is one JSON object.

    .venv/bin/python benchmarks/value_baseline.py [--samples 15] [--folds 8] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.distill import ensure_database, log, setup_django  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/trove_bench_value"
MIN_RUNS = 200
SPLITS = {"train": 0.6, "val": 0.2, "test": 0.2}


def run_demo_job(samples: int, max_steps: int, concurrency: int) -> int:
    """A real demo rollout job, as `manage.py demo` runs it; returns the job id once it has ended."""
    from webapp.rollouts.models import RolloutJob
    from webapp.rollouts.services import job_create
    from workers.seed import DEMO_MODEL_NAME, seed_demo_endpoint, seed_demo_task_set, seed_local_fleet
    from workers.stack import start_embedded_stack
    from workers.tasks.fleets import reconcile_all
    from workers.tasks.rollouts import enqueue_rollout

    task_set = seed_demo_task_set()
    fleet = seed_local_fleet(min_warm=concurrency, max_warm=concurrency * 2, max_total=concurrency * 4)
    stack = start_embedded_stack(demo_model=True, concurrency=concurrency)
    try:
        model_url = f"{stack.demo_model_url.rstrip('/').removesuffix('/v1')}/v1"
        reconcile_all()
        job = job_create(task_set=task_set, fleet=fleet, endpoint=seed_demo_endpoint(model_url), model_name=DEMO_MODEL_NAME,
                         samples_per_task=samples, max_steps=max_steps, concurrency=concurrency,
                         name=f"value baseline benchmark: {task_set.name} x {samples}", enqueue=enqueue_rollout)  # fmt: skip
        started, shown = time.monotonic(), -1
        while True:
            job.refresh_from_db()
            done = job.rollouts.exclude(status__in=("queued", "running")).count()
            if done != shown and done % 10 == 0:
                log(f"  {done}/{job.rollouts.count()} rollouts finished ({time.monotonic() - started:.0f} s)")
                shown = done
            if job.status not in (RolloutJob.Status.QUEUED, RolloutJob.Status.RUNNING):
                return job.pk
            time.sleep(2)
    finally:
        stack.stop()


def demo_runs() -> tuple[int, float]:
    from experience.models import Trajectory
    from workers.seed import DEMO_TASK_SET

    runs = Trajectory.objects.filter(task_set=DEMO_TASK_SET, success__isnull=False)
    total = runs.count()
    return total, (runs.filter(success=True).count() / total if total else 0.0)


def fold(seed: int, trials: int) -> dict[str, Any]:
    """Build a value version with split seed `seed` and run the baseline on it."""
    from experience.services import datasets
    from experience.services.value_baseline import value_baseline_run
    from workers.seed import DEMO_TASK_SET

    dataset = datasets.dataset_create(name=f"bench-value-{seed}-{int(time.time())}", kind="value",
                                      filters={"task_sets": [DEMO_TASK_SET]}, options={"seed": seed, "splits": SPLITS})  # fmt: skip
    # force: a fold is one assignment of the demo's 14 tasks, kept as it falls even when a split gets none
    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    assert version.status == "ready", version.error
    metrics = value_baseline_run(version=version, best_of=(2, 4, 8), trials=trials, seed=seed, scope="test")
    return {"seed": seed, "rows": version.row_count, **metrics}


def pooled(folds: list[dict[str, Any]], n: int, pick: str) -> float | None:
    """Mean over every test task of every fold (each fold's rate weighted by its test tasks)."""
    rows = [f["best_of_n"][str(n)] for f in folds if f["best_of_n"][str(n)]["tasks"]]
    tasks = sum(row["tasks"] for row in rows)
    return sum(row[pick] * row["tasks"] for row in rows) / tasks if tasks else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--folds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="use the demo runs already in the database")
    args = parser.parse_args()
    ensure_database(args.database_url)
    os.environ.pop("REDIS_URL", None)  # the embedded worker: rollouts run in this process
    setup_django(args.database_url)
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    settings.TROVE_DATASET_DIR = Path(settings.VAR_DIR) / "bench-datasets"
    runs, _rate = demo_runs()
    if not args.reuse or runs < MIN_RUNS:
        log(f"running a demo job: 14 tasks x {args.samples} samples (the store has {runs} demo runs)")
        started = time.monotonic()
        run_demo_job(args.samples, args.max_steps, args.concurrency)
        log(f"  job done in {time.monotonic() - started:.0f} s")
    runs, success_rate = demo_runs()
    log(f"store: {runs} demo runs with an outcome, success rate {success_rate:.2f}")
    folds = []
    for seed in range(args.folds):
        result = fold(seed, args.trials)
        four = result["best_of_n"]["4"]
        log(f"  fold {seed}: auc_val {result['auc_val']}, best-of-4 random {four['random']} "
            f"reranked {four['reranked']} oracle {four['oracle']} over {four['tasks']} test tasks")  # fmt: skip
        folds.append(result)
    aucs = [f["auc_val"] for f in folds if f["auc_val"] is not None]
    summary: dict[str, Any] = {"runs": runs, "success_rate": round(success_rate, 3), "folds": len(folds),
                               "auc_val": round(mean(aucs), 3) if aucs else None, "auc_val_folds": len(aucs)}  # fmt: skip
    for n in (2, 4, 8):
        for pick in ("random", "reranked", "oracle"):
            value = pooled(folds, n, pick)
            summary[f"bestof{n}_{pick}"] = round(value, 3) if value is not None else None
        summary[f"bestof{n}_test_tasks"] = sum(f["best_of_n"][str(n)]["tasks"] for f in folds)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
