from collections import Counter, defaultdict

import pytest
from distill_factories import careful_fix, source_run

from experience.distill.spec import DatasetSpec
from experience.distill.splits import repo_group_key, split_for_task, split_of
from experience.distill.values import value_rows


@pytest.mark.parametrize(
    ("task_key", "group"),
    [
        ("django__django-11099", "django/django"),
        ("scikit-learn__scikit-learn-25500", "scikit-learn/scikit-learn"),
        ("pydata__xarray-4094", "pydata/xarray"),
        ("humanevalfix-python-0", "humanevalfix-python-0"),
        ("plain-task", "plain-task"),
    ],
)
def test_repo_grouping_reads_the_swe_bench_instance_id(task_key, group):
    assert repo_group_key(task_key) == group


def test_no_task_lands_in_two_splits_and_a_rebuild_gives_the_same_split():
    runs = [
        source_run(f"{task}-{attempt}", careful_fix(), task_key=f"acme__lib-{task}", success=attempt % 2 == 0)
        for task in range(60)
        for attempt in range(3)
    ]
    spec = DatasetSpec(kind="value", seed=3)

    first = [(row["task_key"], row["split"]) for row in value_rows(runs, spec)]
    second = [(row["task_key"], row["split"]) for row in value_rows(reversed(runs), spec)]

    splits_of_task = defaultdict(set)
    for task_key, split in first:
        splits_of_task[task_key].add(split)
    assert all(len(splits) == 1 for splits in splits_of_task.values())
    assert set(first) == set(second)
    assert {split for splits in splits_of_task.values() for split in splits} == {"train", "val", "test"}


def test_grouping_by_repo_keeps_a_repository_in_one_split():
    spec = DatasetSpec(kind="value", group_by="repo", seed=1)
    tasks = [f"{repo}__{repo}-{n}" for repo in ("django", "sympy", "astropy", "flask") for n in range(30)]

    splits_of_repo = defaultdict(set)
    for task in tasks:
        group, split = split_for_task(task, spec)
        splits_of_repo[group].add(split)

    assert set(splits_of_repo) == {"django/django", "sympy/sympy", "astropy/astropy", "flask/flask"}
    assert all(len(splits) == 1 for splits in splits_of_repo.values())


def test_split_sizes_follow_the_fractions_and_the_seed_reshuffles():
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    groups = [f"task-{n}" for n in range(5000)]

    sizes = Counter(split_of(group, seed=0, fractions=fractions) for group in groups)
    reseeded = [split_of(group, seed=1, fractions=fractions) for group in groups]

    assert 0.77 < sizes["train"] / 5000 < 0.83
    assert 0.08 < sizes["val"] / 5000 < 0.12
    assert reseeded != [split_of(group, seed=0, fractions=fractions) for group in groups]
    assert {split_of(g, seed=0, fractions={"train": 1.0, "val": 0.0, "test": 0.0}) for g in groups} == {
        "train"
    }
