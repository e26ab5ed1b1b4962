"""Deterministic train / val / test assignment by group (task or repository).

A group's split is a pure function of (group key, seed, fractions): sha256 of "seed:group" read as a number
in [0, 1) and placed on the cumulative fractions. So every run of a task lands in the same split, a
rebuild gives the same split, and adding data never moves an existing task to another split.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping

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
