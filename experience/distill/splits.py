"""Deterministic train / val / test assignment by group (task or repository).

A group's split is a pure function of (group key, seed, fractions): sha256 of "seed:group" read as a number
in [0, 1) and placed on the cumulative fractions. So every run of a task lands in the same split, a
rebuild gives the same split, and adding data never moves an existing task to another split.

A split meant to hold some of the tasks (fraction above 0) can still get none of them: the default
0.8 / 0.1 / 0.1 gave a 14-task set no test task. `check_splits` says so before a build (it is refused unless
forced, with the spread and a seed that would fill every split), and `split_note` records in the manifest
which splits came out empty and whether the build was forced past the warning.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from experience.distill.errors import DistillError
from experience.distill.spec import SPLITS, DatasetSpec

GroupKey = Callable[[str], str]

# SWE-bench instance ids: "<owner>__<repo>-<number>", e.g. "django__django-11099".
_SWE_BENCH_ID = re.compile(r"^(?P<owner>[^/]+?)__(?P<repo>.+)-\d+$")


def task_group_key(task_key: str) -> str:
    """Group by task: each task is its own group."""
    return task_key


def repo_group_key(task_key: str) -> str:
    """Group by repository: "django__django-123" -> "django/django".

    Keys that are not SWE-bench style instance ids are their own group (same as grouping by task).
    """
    match = _SWE_BENCH_ID.match(task_key)
    if match is None:
        return task_key
    return f"{match['owner']}/{match['repo']}"


def group_key_for(spec: DatasetSpec) -> GroupKey:
    return repo_group_key if spec.group_by == "repo" else task_group_key


def unit_interval(*parts: object) -> float:
    """A stable number in [0, 1) from the parts (sha256; independent of PYTHONHASHSEED)."""
    text = ":".join(str(part) for part in parts)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(group: str, *, seed: int, fractions: Mapping[str, float]) -> str:
    """The split of a group. Fractions are taken in train, val, test order."""
    point = unit_interval(seed, group)
    cumulative = 0.0
    for name in SPLITS:
        cumulative += fractions[name]
        if point < cumulative:
            return name
    # Rounding can leave the cumulative sum a hair under 1: fall into the last split that is not empty.
    return next(name for name in reversed(SPLITS) if fractions[name] > 0)


def split_for_task(task_key: str, spec: DatasetSpec) -> tuple[str, str]:
    """(group key, split) of a task under the spec."""
    group = group_key_for(spec)(task_key)
    return group, split_of(group, seed=spec.seed, fractions=spec.splits)


# --- empty splits ------------------------------------------------------------------------------------------

SEED_TRIES = 100  # seeds tried when suggesting one that leaves no split empty


class EmptySplitError(DistillError):
    """A split with a share of the tasks would get none of them. Refused unless the request is forced."""

    status_code = 422
    code = "empty_split"

    def __init__(self, message: str, *, empty: list[str]) -> None:
        super().__init__(message, field="options.splits")
        self.empty = empty


def groups_per_split(groups: Iterable[str], *, seed: int, fractions: Mapping[str, float]) -> dict[str, int]:
    """How many of the groups fall in each split (every split named, in split order)."""
    counts = dict.fromkeys(SPLITS, 0)
    for group in groups:
        counts[split_of(group, seed=seed, fractions=fractions)] += 1
    return counts


def empty_splits(counts: Mapping[str, int], fractions: Mapping[str, float]) -> list[str]:
    """The splits meant to hold something (fraction above 0) that hold nothing, in split order."""
    return [name for name in SPLITS if fractions[name] > 0 and not counts.get(name)]


def seed_filling_every_split(groups: Collection[str], *, fractions: Mapping[str, float], after: int) -> int | None:
    """The first seed after `after` (within SEED_TRIES) that leaves no split empty, or None."""
    wanted = sum(1 for name in SPLITS if fractions[name] > 0)
    if len(groups) < wanted:
        return None
    for seed in range(after + 1, after + 1 + SEED_TRIES):
        if not empty_splits(groups_per_split(groups, seed=seed, fractions=fractions), fractions):
            return seed
    return None


def check_splits(groups: Collection[str], spec: DatasetSpec) -> list[str]:
    """Raise EmptySplitError saying which split would be empty, how the groups fall, and what would fix it;
    returns the (empty) list of empty splits otherwise. `groups`: the distinct group keys of the runs the
    build would use."""
    counts = groups_per_split(groups, seed=spec.seed, fractions=spec.splits)
    empty = empty_splits(counts, spec.splits)
    if not empty:
        return []
    raise EmptySplitError(empty_split_message(groups, spec, counts, empty), empty=empty)


def empty_split_message(groups: Collection[str], spec: DatasetSpec, counts: Mapping[str, int], empty: list[str]) -> str:
    unit = "repositories" if spec.group_by == "repo" else "tasks"
    named = " and ".join(f"{name} ({spec.splits[name]:g} of the {unit})" for name in empty)
    spread = ", ".join(f"{counts[name]} in {name}" for name in SPLITS)
    fixes = ["pass force to build anyway", "change options.splits"]
    seed = seed_filling_every_split(groups, fractions=spec.splits, after=spec.seed)
    if seed is not None:
        fixes.append(f"use options.seed={seed}, which gives every split some {unit}")
    return (f"split {named} would be empty: the {len(groups)} {unit} of the usable runs fall {spread} "
            f"(seed {spec.seed}); {', or '.join(fixes)}")


def split_note(spec: DatasetSpec, splits: Mapping[str, Mapping[str, Any]], *, forced: list[str]) -> dict[str, Any]:
    """The manifest's word on empty splits: which splits meant to hold rows hold none, and the warnings the
    request was forced past (`force`)."""
    rows = {name: int((splits.get(name) or {}).get("rows") or 0) for name in SPLITS}
    return {"empty": empty_splits(rows, spec.splits), "forced": bool(forced), "warnings": list(forced)}
