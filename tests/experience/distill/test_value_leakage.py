"""No value model feature leaks the outcome: the evaluation step and everything after a decision are unseen.

The runs (`value_runs`) carry an evaluation step that tells their outcome exactly. Removing it, or giving
every run another run's evaluation, must leave every prediction and every best-of-N figure as it was, for
the baseline and for the learned model; and a decision's features must not move when anything after it
in the run changes (later outputs, later decisions, the evaluation, the outcome).
"""

import random
from dataclasses import replace

import numpy as np
import pytest
from value_runs import demo_like_runs, eval_step, with_eval_of, without_eval

from experience.distill import baseline
from experience.distill.decisions import decision_points
from experience.distill.spec import DatasetSpec
from experience.distill.values import decision_inputs, value_rows
from experience.records import StepRecord

SPEC = DatasetSpec(kind="value")


def by_task(runs):
    grouped: dict[str, list] = {}
    for run in runs:
        grouped.setdefault(run.task_key, []).append(run.record)
    return grouped


def figures(train_model, train_runs, test_runs):
    """Predictions on every held-out decision, and best-of-2 / best-of-4 on the held-out tasks."""
    model = train_model(list(value_rows(train_runs, SPEC)))
    predictions = model.predict(list(value_rows(test_runs, SPEC)))
    best = [baseline.best_of_n(model, by_task(test_runs), n, trials=50, seed=0) for n in (2, 4)]
    return predictions, best


def shuffled_evals(runs, seed):
    """Each run with the evaluation step of a run picked at random (its own outcome label kept)."""
    rng = random.Random(seed)
    donors = rng.sample(runs, len(runs))
    return [with_eval_of(run, donor) for run, donor in zip(runs, donors, strict=True)]


def train_baseline(rows):
    return baseline.train(rows)


def train_learned(rows):
    learned_value = pytest.importorskip("experience.distill.learned_value")
    return learned_value.train(rows, epochs=60)


@pytest.mark.parametrize("train_model", [train_baseline, train_learned], ids=["baseline", "learned"])
def test_removing_or_shuffling_the_evaluation_steps_changes_no_score(train_model):
    train_runs, test_runs = demo_like_runs(1, 10, 4), demo_like_runs(2, 6, 4, prefix="heldout")
    assert any(step.kind == "eval" for run in train_runs for step in run.record.steps)

    predictions, best = figures(train_model, train_runs, test_runs)
    removed = figures(train_model, [without_eval(r) for r in train_runs], [without_eval(r) for r in test_runs])
    shuffled = figures(train_model, shuffled_evals(train_runs, 3), shuffled_evals(test_runs, 4))

    assert np.array_equal(predictions, removed[0]) and np.array_equal(predictions, shuffled[0])
    assert best == removed[1] == shuffled[1]
    # The evaluation tells the outcome exactly, so a model reading it would rank like the oracle.
    four = best[1]
    assert four["tasks"] == 6 and four["reranked"] < four["oracle"]


def feature_view(row):
    """Everything of a row a model reads: the baseline's text and numbers, the learned model's texts."""
    from experience.distill.learned_value import row_texts

    return (baseline.row_text(row), baseline.row_numbers(row, SPEC.context_budget_tokens), row_texts(row))


def changed_after(record, step_index):
    """The record with every step after `step_index` changed: other outputs, an extra decision, the
    evaluation and the outcome flipped."""
    steps = list(record.steps[: step_index + 1])
    for step in record.steps[step_index + 1 :]:
        if step.kind == "command":
            step = replace(step, output="Traceback: something else entirely", exit_code=2)
        elif step.kind == "model_call":
            step = replace(step, response_text="A different plan.\n\n```bash\nrm -rf build\n```")
        elif step.kind == "eval":
            step = eval_step(not record.success)
        steps.append(step)
    steps += [
        StepRecord(kind="model_call", response_text="One more.\n\n```bash\nls\n```"),
        StepRecord(kind="command", command="ls", output="a b c", exit_code=0),
    ]
    return replace(record, steps=steps, success=not record.success, reward=1.0 - (record.reward or 0.0))


def test_the_features_at_a_decision_do_not_change_when_anything_after_it_changes():
    model = baseline.train(value_rows(demo_like_runs(5, 8, 4), SPEC))
    for run in demo_like_runs(6, 3, 3):
        record = run.record
        original = list(decision_inputs(record, SPEC))
        scores = baseline.score_steps(model, record)
        for decision in decision_points(record):
            later = changed_after(record, decision.first_step)
            rows = list(decision_inputs(later, SPEC))[: decision.t]
            assert [feature_view(row) for row in rows] == [feature_view(row) for row in original[: decision.t]]
            later_scores = baseline.score_steps(model, later)
            assert later_scores[: decision.first_step + 1] == scores[: decision.first_step + 1]


def test_a_model_that_read_the_evaluation_would_be_caught():
    """The check above can fail: rows whose context ends with the evaluation's text rank the held-out
    decisions almost perfectly, and predict differently from rows without it."""

    def leaky(runs):
        rows = []
        for run in runs:
            (evaluation,) = [step for step in run.record.steps if step.kind == "eval"]
            for row in value_rows([run], SPEC):
                rows.append(row | {"messages": [*row["messages"], {"role": "user", "content": evaluation.text}]})
        return rows

    train_runs, test_runs = demo_like_runs(1, 10, 4), demo_like_runs(2, 6, 4, prefix="heldout")
    clean = baseline.train(value_rows(train_runs, SPEC))
    cheat = baseline.train(leaky(train_runs))

    assert baseline.auc(cheat, leaky(test_runs)) > 0.95 > baseline.auc(clean, value_rows(test_runs, SPEC))
