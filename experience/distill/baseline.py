"""A baseline value model: proof that a value/outcome set carries signal.

Features of a row: a hashed bag of words over the tail of the context (the last `TAIL_CHARS`
characters: what happened most recently) and the action, plus counts known at decision time (decision
index, actions, errors and test runs so far, the share of the context budget used) and the rubric
labels. A logistic regression predicts success; its probability at a decision is the value estimate.

Only what the agent had in front of it when it chose goes in: the model call's request (or the
conversation rebuilt from the steps before the decision), the action it produced, and counts and labels of
the steps before it. Never the evaluation step, the run's outcome, or a message produced after the decision
(tests/experience/distill/test_value_leakage.py pins both). The run's length T is deliberately not a
feature: at decision t it is not yet known, and long runs fail more often, so t/T would leak the outcome.

`best_of_n` measures what the model is for: given n runs of a held-out task, pick one. Random pick, the pick
the model ranks highest, and the oracle (did any of the n succeed) bound the gain. `ranking_metrics` gives
ROC AUC and the expected calibration error (ECE) of predicted values against outcomes.

Every function here takes any `ValueModel` (a `spec` and a `predict`): the learned model
(`learned_value.LearnedValueModel`) is measured and scored exactly as this one is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from experience.distill.errors import DistillError
from experience.distill.rubric import LABELS
from experience.distill.source import run_success
from experience.distill.spec import DatasetSpec
from experience.distill.values import decision_inputs
from experience.records import TrajectoryRecord

Row = Mapping[str, Any]
N_FEATURES = 2**18
TAIL_CHARS = 2000
ECE_BINS = 10


class ValueModel(Protocol):
    """What the measuring and scoring functions need of a value model."""

    spec: DatasetSpec

    def predict(self, rows: Sequence[Row]) -> np.ndarray:
        """P(success) per row."""
        ...


@dataclass
class BaselineModel:
    """A trained classifier and the spec used to render rows from new runs when scoring them."""

    classifier: LogisticRegression
    spec: DatasetSpec = field(default_factory=lambda: DatasetSpec(kind="value"))
    n_features: int = N_FEATURES

    def predict(self, rows: Sequence[Row]) -> np.ndarray:
        """P(success) per row."""
        if not rows:
            return np.zeros(0)
        matrix = features(rows, self.n_features, self.spec.context_budget_tokens)
        return self.classifier.predict_proba(matrix)[:, 1]


def context_text(row: Row) -> str:
    """The row's context as one string (the messages' contents joined by newlines)."""
    return "\n".join(str(message.get("content") or "") for message in row.get("messages") or [])


def action_text(row: Row) -> str:
    return str((row.get("action") or {}).get("content") or "")


def row_text(row: Row) -> str:
    """The tail of the context plus the action, as one string."""
    return context_text(row)[-TAIL_CHARS:] + "\n" + action_text(row)


def row_numbers(row: Row, budget: int) -> list[float]:
    """Counts known at decision time, log-scaled, and the rubric labels as 0/1."""
    stats = row.get("stats") or {}
    step = row.get("step_index", row.get("step_count", 0))
    counts = [step] + [stats.get(key, 0) for key in ("actions_before", "errors_before", "test_runs_before")]
    counts += [stats.get("passed_test_runs_before", 0), stats.get("source_edits_before", 0)]
    numbers = [math.log1p(float(count)) for count in counts]
    numbers.append(min(float(stats.get("context_tokens", 0)) / budget, 4.0))
    labels = row.get("rubric") or {}
    numbers += [1.0 if labels.get(label) else 0.0 for label in LABELS]
    return numbers


def features(rows: Sequence[Row], n_features: int = N_FEATURES, budget: int = 8192) -> sparse.csr_matrix:
    # HashingVectorizer is stateless: nothing to fit, and the same text always lands on the same columns.
    vectorizer = HashingVectorizer(n_features=n_features, alternate_sign=False, norm="l2")
    text = vectorizer.transform([row_text(row) for row in rows])
    numbers = sparse.csr_matrix(np.array([row_numbers(row, budget) for row in rows], dtype=np.float64))
    return sparse.hstack([text, numbers], format="csr")


def train(rows_train: Iterable[Row], *, spec: DatasetSpec | None = None, seed: int = 0) -> BaselineModel:
    """Fit on value or outcome rows (label: `outcome`). Needs both outcomes among the rows."""
    rows = list(rows_train)
    labels = np.array([bool(row["outcome"]) for row in rows])
    if len(set(labels.tolist())) < 2:
        raise DistillError("training rows need both successful and failed outcomes")
    model = BaselineModel(
        classifier=LogisticRegression(solver="liblinear", class_weight="balanced", random_state=seed)
    )
    if spec is not None:
        model.spec = spec
    model.classifier.fit(features(rows, model.n_features, model.spec.context_budget_tokens), labels)
    return model


def auc(model: ValueModel, rows_val: Iterable[Row]) -> float:
    """ROC AUC of the predicted value against `outcome`. Needs both outcomes among the rows."""
    rows = list(rows_val)
    labels = [bool(row["outcome"]) for row in rows]
    if len(set(labels)) < 2:
        raise DistillError("AUC needs both successful and failed outcomes among the rows")
    return float(roc_auc_score(labels, model.predict(rows)))


def calibration_error(
    probabilities: Sequence[float], outcomes: Sequence[bool], bins: int = ECE_BINS
) -> float:
    """Expected calibration error: predictions put in `bins` equal-width bins of [0, 1]; the mean over
    bins, weighted by their share of predictions, of |share of successes - mean prediction|."""
    predicted = np.asarray(probabilities, dtype=np.float64)
    actual = np.asarray(outcomes, dtype=np.float64)
    if predicted.size == 0:
        raise DistillError("calibration needs at least one prediction")
    which = np.minimum((predicted * bins).astype(np.int64), bins - 1)
    error = 0.0
    for b in np.unique(which):
        inside = which == b
        error += inside.mean() * abs(actual[inside].mean() - predicted[inside].mean())
    return float(error)


def ranking_metrics(probabilities: Sequence[float], outcomes: Sequence[bool]) -> dict[str, Any]:
    """{"count", "success_rate", "auc", "ece"} of predictions against outcomes. `auc` is None (with
    `auc_note`) when the outcomes are all the same; `ece` needs only one prediction."""
    outcomes = [bool(outcome) for outcome in outcomes]
    if not outcomes:
        return {"count": 0, "success_rate": None, "auc": None, "ece": None, "auc_note": "no rows"}
    result: dict[str, Any] = {
        "count": len(outcomes),
        "success_rate": sum(outcomes) / len(outcomes),
        "ece": calibration_error(probabilities, outcomes),
    }
    if len(set(outcomes)) < 2:
        return result | {"auc": None, "auc_note": "AUC needs both successful and failed outcomes"}
    return result | {"auc": float(roc_auc_score(outcomes, probabilities))}


def score_steps(model: ValueModel, record: TrajectoryRecord) -> list[float | None]:
    """The value estimate at each step, aligned with `record.steps`: P(success) at the step where a
    decision starts (its model call, or its action), None at steps that are not decisions."""
    inputs = list(decision_inputs(record, model.spec))
    scores: list[float | None] = [None] * len(record.steps)
    for row, value in zip(inputs, model.predict(inputs), strict=True):
        scores[row["record_step"]] = float(value)
    return scores


def run_score(model: ValueModel, record: TrajectoryRecord, aggregate: str = "last") -> float:
    """One number per run: the value at its last decision, or the mean over decisions."""
    return aggregate_scores(score_steps(model, record), aggregate)


def aggregate_scores(step_scores: Sequence[float | None], aggregate: str = "last") -> float:
    """A run's score from its step scores (`score_steps`): the last decision's value, or the mean."""
    values = [value for value in step_scores if value is not None]
    if not values:
        return 0.0
    return values[-1] if aggregate == "last" else float(np.mean(values))


def best_of_n(
    model: ValueModel,
    runs_by_task_test: Mapping[str, Sequence[TrajectoryRecord]],
    n: int,
    trials: int,
    seed: int,
    *,
    aggregate: str = "last",
) -> dict[str, Any]:
    """Success rate of picking one of n runs per test task: at random, by the model, and the oracle.

    Runs of unknown outcome are left out; see `best_of_n_scored` for the draws."""
    scored = {
        task_key: [
            (bool(run_success(run)), run_score(model, run, aggregate))
            for run in runs
            if run_success(run) is not None
        ]
        for task_key, runs in runs_by_task_test.items()
    }
    return best_of_n_scored(scored, n, trials, seed)


def best_of_n_scored(
    scored_by_task: Mapping[str, Sequence[tuple[bool, float]]], n: int, trials: int, seed: int
) -> dict[str, Any]:
    """Best-of-n from each task's runs as (outcome, the model's score).

    For each task with at least n runs, each trial samples n runs (a per-task RNG seeded by (seed, task),
    so results do not depend on task order) and scores the three picks. Rates are means over all
    (task, trial) pairs; they are None when no task has n runs.
    """
    totals = {"random": 0, "reranked": 0, "oracle": 0}
    draws = 0
    tasks = 0
    for task_key in sorted(scored_by_task):
        runs = scored_by_task[task_key]
        if len(runs) < n:
            continue
        tasks += 1
        outcomes = [outcome for outcome, _score in runs]
        scores = [score for _outcome, score in runs]
        rng = random.Random(f"{seed}:{task_key}")
        for _ in range(trials):
            sample = rng.sample(range(len(runs)), n)
            totals["random"] += outcomes[rng.choice(sample)]
            totals["reranked"] += outcomes[max(sample, key=lambda i: scores[i])]
            totals["oracle"] += any(outcomes[i] for i in sample)
            draws += 1
    rates = {name: (total / draws if draws else None) for name, total in totals.items()}
    return rates | {"tasks": tasks, "trials": trials, "n": n}
