"""The baseline value model run on a dataset version: train, measure, score the runs back.

`value_baseline_run` trains `distill.baseline` on a ready `value` or `outcome` version's train rows (read
back from its JSONL.gz files, a line at a time), reports ROC AUC on the val rows and a best-of-N table
on the test tasks (random pick vs the model's pick vs the oracle), stores them on
`DatasetVersion.metrics`, and writes the value estimate at each decision back to `Step.value_estimate`
for the test-split runs (or all of the version's runs), so the replay page can draw the value curve.

Memory: each row read is cut down to what the features use (the last `TAIL_CHARS` characters of its
context, the action, counts and rubric labels) before it is kept for training, and the runs to score are
streamed from the store a task at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.utils import timezone

from experience.distill import baseline
from experience.distill.errors import DistillError
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.errors import ValidationError
from experience.models import DatasetVersion, Step
from experience.services.dataset_source import StoredRun, runs_matching, stored_run_batches
from experience.services.datasets import version_rows

KINDS = ("value", "outcome")
BEST_OF = (2, 4, 8)
SCOPES = ("test", "all")
UPDATE_BATCH = 1000
MODEL_NAME = "logreg-hashing-baseline"


def value_baseline_run(
    *,
    version: DatasetVersion,
    best_of: Sequence[int] = BEST_OF,
    trials: int = 200,
    seed: int = 0,
    scope: str = "test",
    aggregate: str = "last",
) -> dict[str, Any]:
    """Train, evaluate and score; returns the metrics (also saved on the version). Raises
    `ValidationError` for a version it cannot use and `DistillError` when the train rows hold one outcome."""
    _check_usable(version, scope)
    spec = DatasetSpec.from_dict(version.spec)
    model = baseline.train(_slim_rows(version, "train"), spec=spec, seed=seed)
    metrics: dict[str, Any] = {
        "model": MODEL_NAME,
        "trained_at": timezone.now().isoformat(),
        "seed": seed,
        "train_rows": version.manifest["splits"]["train"]["rows"],
        "val_rows": version.manifest["splits"]["val"]["rows"],
        **_val_auc(model, version),
        "best_of_n": _best_of_n(model, version, spec, best_of, trials, seed, aggregate),
        "aggregate": aggregate,
        **_score_runs(model, version, spec, scope),
    }
    DatasetVersion.objects.filter(pk=version.pk).update(metrics=metrics)
    version.metrics = metrics
    return metrics


def _check_usable(version: DatasetVersion, scope: str) -> None:
    if version.status != DatasetVersion.Status.READY:
        raise ValidationError(f"version: {version} is {version.status}, not ready", field="version")
    if version.spec.get("kind") not in KINDS:
        raise ValidationError(
            f"version: {version} is a {version.spec.get('kind')} set; the baseline needs a value or outcome set",
            field="version",
        )
    if scope not in SCOPES:
        raise ValidationError(f"scope: must be one of {', '.join(SCOPES)}", field="scope")


def _slim_rows(version: DatasetVersion, split: str) -> Iterator[dict[str, Any]]:
    """The split's rows, each cut to what `baseline.features` reads. The context keeps only its last
    TAIL_CHARS characters, joined as `baseline.row_text` joins them, so the features are unchanged."""
    for row in version_rows(version=version, split=split):
        context = "\n".join(str(m.get("content") or "") for m in row.get("messages") or [])
        slim = {
            "messages": [{"role": "user", "content": context[-baseline.TAIL_CHARS :]}],
            "action": {"content": (row.get("action") or {}).get("content") or ""},
            "stats": row.get("stats") or {},
            "rubric": row.get("rubric") or {},
            "outcome": row["outcome"],
        }
        # Outcome rows have a step count and no step index: keep whichever the row has.
        yield slim | {key: row[key] for key in ("step_index", "step_count") if key in row}


def _val_auc(model: baseline.BaselineModel, version: DatasetVersion) -> dict[str, Any]:
    rows = list(_slim_rows(version, "val"))
    try:
        return {"auc_val": baseline.auc(model, rows)}
    except DistillError as error:
        return {"auc_val": None, "auc_val_note": error.message}


def version_runs_by_task(
    version: DatasetVersion, spec: DatasetSpec, *, split: str | None
) -> Iterator[tuple[str, list[StoredRun]]]:
    """The version's source runs (of one split, or all), one task at a time, streamed from the store.

    The version's own filters select a superset (the store may have grown since); its manifest's source
    ids narrow that to exactly its runs, in Python, so no query carries thousands of ids.
    """
    ids = {int(i) for i in version.manifest.get("source_trajectory_ids", [])}
    splits: dict[str, str] = {}

    def keep(row: dict[str, Any]) -> bool:
        if row["id"] not in ids:
            return False
        if split is None:
            return True
        if row["task_key"] not in splits:
            splits[row["task_key"]] = split_for_task(row["task_key"], spec)[1]
        return splits[row["task_key"]] == split

    # The version already chose these runs: read them all, whatever the curation marks say now.
    reading = DatasetSpec.from_dict(spec.to_dict() | {"include_duplicates": True, "include_rejected": True})
    batches = stored_run_batches(runs_matching(spec.filters), reading, keep=keep)
    runs = (run for batch in batches for run in batch)
    for task_key, task_runs in itertools.groupby(runs, key=lambda run: run.task_key):
        yield task_key, [run for run in task_runs if run.record.steps]


def _best_of_n(
    model: baseline.BaselineModel,
    version: DatasetVersion,
    spec: DatasetSpec,
    best_of: Sequence[int],
    trials: int,
    seed: int,
    aggregate: str,
) -> dict[str, Any]:
    """Per N, rates averaged over the test tasks with at least N runs (each task `trials` draws)."""
    per_n: dict[int, list[dict[str, Any]]] = {n: [] for n in best_of}
    for task_key, runs in version_runs_by_task(version, spec, split="test"):
        records = {task_key: [run.record for run in runs]}
        for n in best_of:
            result = baseline.best_of_n(model, records, n, trials, seed, aggregate=aggregate)
            if result["tasks"]:
                per_n[n].append(result)
    return {str(n): _mean_rates(results, n, trials) for n, results in per_n.items()}


def _mean_rates(results: Sequence[Mapping[str, Any]], n: int, trials: int) -> dict[str, Any]:
    rates: dict[str, Any] = {"n": n, "tasks": len(results), "trials": trials}
    for name in ("random", "reranked", "oracle"):
        rates[name] = sum(r[name] for r in results) / len(results) if results else None
    return rates


def _score_runs(
    model: baseline.BaselineModel, version: DatasetVersion, spec: DatasetSpec, scope: str
) -> dict[str, Any]:
    """Write each decision's value estimate to its step (None on the steps between decisions)."""
    runs_scored = steps_scored = 0
    pending: list[Step] = []
    for _task, runs in version_runs_by_task(version, spec, split="test" if scope == "test" else None):
        for run in runs:
            scores = baseline.score_steps(model, run.record)
            pending += [Step(pk=pk, value_estimate=v) for pk, v in zip(run.step_ids, scores, strict=True)]
            runs_scored += 1
            steps_scored += sum(1 for value in scores if value is not None)
            if len(pending) >= UPDATE_BATCH:
                _write_estimates(pending)
                pending = []
    _write_estimates(pending)
    return {"score_scope": scope, "scored_runs": runs_scored, "scored_steps": steps_scored}


def _write_estimates(steps: Iterable[Step]) -> None:
    Step.objects.bulk_update(list(steps), ["value_estimate"], batch_size=UPDATE_BATCH)
