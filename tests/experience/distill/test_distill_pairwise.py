from collections import Counter

import pytest
from distill_factories import TASK, broken_fix, careful_fix, source_run

from experience.distill.errors import UnorderedInputError
from experience.distill.pairwise import pairwise_rows
from experience.distill.spec import DatasetSpec


def task_runs(task_key, wins, losses):
    runs = [
        source_run(f"{task_key}-win-{n}", careful_fix(), task_key=task_key, success=True) for n in range(wins)
    ]
    runs += [
        source_run(f"{task_key}-loss-{n}", broken_fix(), task_key=task_key, success=False)
        for n in range(losses)
    ]
    return runs


def test_pairs_only_join_a_success_and_a_failure_of_the_same_task():
    runs = task_runs("a", 2, 2) + task_runs("b", 1, 3) + task_runs("c", 3, 0)

    rows = list(pairwise_rows(runs, DatasetSpec(kind="pairwise")))

    assert len(rows) == 2 * 2 + 1 * 3
    for row in rows:
        assert row["chosen_trajectory_id"].startswith(f"{row['task_key']}-win")
        assert row["rejected_trajectory_id"].startswith(f"{row['task_key']}-loss")
    assert len({(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in rows}) == len(rows)


def test_a_task_with_many_runs_is_capped_so_it_cannot_dominate():
    runs = task_runs("big", 6, 6) + task_runs("small", 1, 1)

    rows = list(pairwise_rows(runs, DatasetSpec(kind="pairwise", max_pairs_per_task=4)))

    assert Counter(row["task_key"] for row in rows) == {"big": 4, "small": 1}


def test_the_pairs_picked_do_not_depend_on_the_order_of_runs_within_a_task():
    runs = task_runs("big", 5, 5)
    spec = DatasetSpec(kind="pairwise", max_pairs_per_task=6, seed=11)

    forward = [(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in pairwise_rows(runs, spec)]
    backward = [
        (r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in pairwise_rows(runs[::-1], spec)
    ]
    reseeded = [
        (r["chosen_trajectory_id"], r["rejected_trajectory_id"])
        for r in pairwise_rows(runs, DatasetSpec(kind="pairwise", max_pairs_per_task=6, seed=12))
    ]

    assert forward == backward
    assert set(forward) != set(reseeded)


def test_a_row_holds_the_task_as_prompt_and_each_run_after_it():
    (row,) = pairwise_rows(task_runs("a", 1, 1), DatasetSpec(kind="pairwise"))

    assert row["prompt"] == [{"role": "user", "content": TASK}]
    assert row["chosen"][0] == {"role": "assistant", "content": "create reproduce.py"}
    assert row["rejected"][0] == {"role": "assistant", "content": "cat src/dates.py"}
    assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)


def test_input_not_ordered_by_task_is_refused():
    runs = task_runs("a", 1, 1) + task_runs("b", 1, 1) + task_runs("a", 1, 0)

    with pytest.raises(UnorderedInputError):
        list(pairwise_rows(runs, DatasetSpec(kind="pairwise")))


def test_duplicates_are_left_out_of_pairs_by_default():
    runs = task_runs("a", 1, 0) + [
        source_run("dup-loss", broken_fix(), task_key="a", success=False, is_duplicate=True)
    ]

    assert list(pairwise_rows(runs, DatasetSpec(kind="pairwise"))) == []
    assert len(list(pairwise_rows(runs, DatasetSpec(kind="pairwise", include_duplicates=True)))) == 1
