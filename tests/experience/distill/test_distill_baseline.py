import random

import pytest
from distill_factories import TASK, command, message, record, source_run

from experience.distill.baseline import auc, best_of_n, score_steps, train
from experience.distill.errors import DistillError
from experience.distill.spec import DatasetSpec
from experience.distill.values import outcome_rows, value_rows

NOISE = ["ls", "cat src/dates.py", "grep -rn parse_date src", "git status", "find . -name '*.py'"]


def synthetic_steps(rng: random.Random, good: bool):
    """Runs that differ only after the fix attempt: good ones pass their checks, bad ones keep failing."""
    steps = [command(rng.choice(NOISE), "output") for _ in range(rng.randint(0, 2))]
    steps += [
        command("python reproduce.py", "Traceback (most recent call last):\nValueError: bad date", 1),
        command("sed -i 's/strict=True/strict=False/' src/dates.py"),
    ]
    if good:
        steps += [
            command("python reproduce.py", "2024-01-01 parsed fine", 0),
            command("pytest", "120 passed in 3s", 0),
        ]
    else:
        steps += [
            command("python reproduce.py", "Traceback (most recent call last):\nKeyError: 'week'", 1),
            command("pytest", "FAILED tests/test_dates.py::test_week\n2 failed, 118 passed", 1),
        ]
    return steps


def synthetic_runs(seed: int, tasks: int, runs_per_task: int):
    rng = random.Random(seed)
    runs = []
    for task in range(tasks):
        for attempt in range(runs_per_task):
            good = rng.random() < 0.5
            runs.append(
                source_run(
                    f"{seed}-{task}-{attempt}",
                    synthetic_steps(rng, good),
                    task_key=f"task-{seed}-{task}",
                    success=good,
                )
            )
    return runs


SPEC = DatasetSpec(kind="value")


def test_the_baseline_separates_successes_from_failures_on_held_out_runs():
    model = train(value_rows(synthetic_runs(1, 40, 3), SPEC))
    val_runs = synthetic_runs(2, 20, 3)

    value_auc = auc(model, value_rows(val_runs, SPEC))
    outcome_auc = auc(model, outcome_rows(val_runs, DatasetSpec(kind="outcome")))

    print(f"baseline AUC: value rows {value_auc:.3f}, outcome rows {outcome_auc:.3f}")
    assert value_auc > 0.5
    assert outcome_auc > 0.9


def test_reranking_picks_better_runs_than_chance_and_no_better_than_the_oracle():
    model = train(value_rows(synthetic_runs(1, 40, 3), SPEC))
    by_task: dict[str, list] = {}
    for run in synthetic_runs(3, 15, 5):
        by_task.setdefault(run.task_key, []).append(run.record)

    result = best_of_n(model, by_task, n=3, trials=20, seed=0)
    again = best_of_n(model, by_task, n=3, trials=20, seed=0)

    print(f"best-of-3: {result}")
    assert result == again
    assert result["tasks"] == 15
    assert result["random"] < result["reranked"] <= result["oracle"]


def test_tasks_with_fewer_than_n_runs_are_skipped():
    model = train(value_rows(synthetic_runs(1, 10, 3), SPEC))
    few = {"t": [run.record for run in synthetic_runs(4, 1, 2)]}

    assert best_of_n(model, few, n=3, trials=5, seed=0) == {
        "random": None,
        "reranked": None,
        "oracle": None,
        "tasks": 0,
        "trials": 5,
        "n": 3,
    }


def test_step_scores_line_up_with_the_steps_and_need_no_outcome():
    model = train(value_rows(synthetic_runs(1, 20, 3), SPEC))
    rng = random.Random(9)
    unscored = record([message("user", TASK)] + synthetic_steps(rng, True), success=None)

    scores = score_steps(model, unscored)

    assert len(scores) == len(unscored.steps)
    assert scores[0] is None
    assert all(score is not None and 0.0 <= score <= 1.0 for score in scores[1:])


def test_training_needs_both_outcomes():
    only_wins = [run for run in synthetic_runs(1, 10, 3) if run.record.success]

    with pytest.raises(DistillError):
        train(value_rows(only_wins, SPEC))
