"""A baseline value model: proof that a value/outcome set carries signal.

Features of a row: a hashed bag of words over the tail of the context (the last `TAIL_CHARS`
characters: what happened most recently) and the action, plus counts known at decision time (decision
index, actions, errors and test runs so far, the share of the context budget used) and the rubric
labels. A logistic regression predicts success; its probability at a decision is the value estimate.

The run's length T is deliberately not a feature: at decision t it is not yet known, and long runs fail
more often, so t/T would leak the outcome.

`best_of_n` measures what the model is for: given n runs of a test task, pick one. Random pick, the pick
the model ranks highest, and the oracle (did any of the n succeed) bound the gain.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


def row_text(row: Row) -> str:
    """The tail of the context plus the action, as one string."""
    context = "\n".join(str(message.get("content") or "") for message in row.get("messages") or [])
    action = row.get("action") or {}
    return context[-TAIL_CHARS:] + "\n" + str(action.get("content") or "")


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


def auc(model: BaselineModel, rows_val: Iterable[Row]) -> float:
    """ROC AUC of the predicted value against `outcome`. Needs both outcomes among the rows."""
    rows = list(rows_val)
    labels = [bool(row["outcome"]) for row in rows]
    if len(set(labels)) < 2:
        raise DistillError("AUC needs both successful and failed outcomes among the rows")
    return float(roc_auc_score(labels, model.predict(rows)))


def score_steps(model: BaselineModel, record: TrajectoryRecord) -> list[float | None]:
    """The value estimate at each step, aligned with `record.steps`: P(success) at the step where a
    decision starts (its model call, or its action), None at steps that are not decisions."""
    inputs = list(decision_inputs(record, model.spec))
    scores: list[float | None] = [None] * len(record.steps)
    for row, value in zip(inputs, model.predict(inputs), strict=True):
        scores[row["record_step"]] = float(value)
    return scores


def run_score(model: BaselineModel, record: TrajectoryRecord, aggregate: str = "last") -> float:
    """One number per run: the value at its last decision, or the mean over decisions."""
    values = [value for value in score_steps(model, record) if value is not None]
    if not values:
        return 0.0
    return values[-1] if aggregate == "last" else float(np.mean(values))


def best_of_n(
    model: BaselineModel,
    runs_by_task_test: Mapping[str, Sequence[TrajectoryRecord]],
    n: int,
    trials: int,
    seed: int,
    *,
    aggregate: str = "last",
) -> dict[str, Any]:
    """Success rate of picking one of n runs per test task: at random, by the model, and the oracle.

    For each task with at least n runs of known outcome, each trial samples n runs (a per-task RNG
    seeded by (seed, task), so results do not depend on task order) and scores the three picks. Rates
    are means over all (task, trial) pairs; they are None when no task has n runs.
    """
    totals = {"random": 0, "reranked": 0, "oracle": 0}
    draws = 0
    tasks = 0
    for task_key in sorted(runs_by_task_test):
        runs = [run for run in runs_by_task_test[task_key] if run_success(run) is not None]
        if len(runs) < n:
            continue
        tasks += 1
        outcomes = [bool(run_success(run)) for run in runs]
        scores = [run_score(model, run, aggregate) for run in runs]
        rng = random.Random(f"{seed}:{task_key}")
        for _ in range(trials):
            sample = rng.sample(range(len(runs)), n)
            totals["random"] += outcomes[rng.choice(sample)]
            totals["reranked"] += outcomes[max(sample, key=lambda i: scores[i])]
            totals["oracle"] += any(outcomes[i] for i in sample)
            draws += 1
    rates = {name: (total / draws if draws else None) for name, total in totals.items()}
    return rates | {"tasks": tasks, "trials": trials, "n": n}
