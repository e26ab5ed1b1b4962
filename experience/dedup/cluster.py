"""Duplicate clusters: exact by action hash, near by cosine, joined with union-find.

Batch (`cluster_items`): every pair of items with the same exact hash, or (within one task unless
`across_tasks`) with cosine >= threshold, is joined; clusters are the connected components. The link is
single-linkage on purpose — a chain of small edits is one family of runs — so a member can sit below the
threshold from its canonical; `similarity` reports that honestly. Within a task of up to `DENSE_LIMIT`
items all pairs are compared exactly (one matrix product); larger groups, and the across-task mode, use
`neighbours` nearest neighbours from a `VectorIndex`.

Incremental (`assign`): a new item joins the cluster of its exact match if the caller found one, else of
its most similar indexed neighbour at or above the threshold (same task unless `across_tasks`), else it
starts its own. It keeps that cluster's canonical: a better canonical is a batch re-cluster's job.

The canonical of a cluster is its earliest id, or the item that sorts first by `canonical_key` (pass
e.g. `lambda item: (-rewards[item.id], item.id)` to prefer the best run). The cluster key is the
canonical's exact hash: content-derived, so it is the same in any store that agrees on the canonical.
The store re-derives canonicals and duplicate marks from outcomes afterwards (`canonical.derive`): these
clusters say which runs did the same thing, not which of them a dataset may leave out.

An item without an exact hash (`signature.NO_SIGNATURE`: a run with no actions) is never joined to
anything, exactly or by similarity: an empty action list says nothing about what a run did.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from experience.dedup.index import VectorIndex

DENSE_LIMIT = 4096
DEFAULT_NEIGHBOURS = 10
MAX_NEIGHBOURS = 1024


@dataclass(frozen=True)
class DedupItem:
    id: int
    task_key: str
    exact_hash: str
    vector: np.ndarray  # unit vector from the embedder


@dataclass(frozen=True)
class Assignment:
    id: int
    cluster_key: str
    canonical_id: int
    similarity: float  # cosine to the canonical; 1.0 for the canonical and its exact duplicates
    match: str  # "canonical", "exact" (same hash as the canonical) or "near"

    @property
    def is_duplicate(self) -> bool:
        return self.id != self.canonical_id


@dataclass(frozen=True)
class Member:
    """What the store knows about an item already placed in a cluster (for `assign`)."""

    id: int
    task_key: str
    cluster_key: str
    canonical_id: int


def cluster_items(
    items: Sequence[DedupItem],
    *,
    threshold: float,
    across_tasks: bool = False,
    neighbours: int = DEFAULT_NEIGHBOURS,
    canonical_key: Callable[[DedupItem], Any] | None = None,
) -> list[Assignment]:
    """One `Assignment` per item, in input order. Deterministic for a given input."""
    if len({item.id for item in items}) != len(items):
        raise ValueError("item ids must be unique")
    components = UnionFind(len(items))
    _join_exact(items, components)
    for group in _groups(items, across_tasks=across_tasks):
        _join_near(items, group, components, threshold=threshold, neighbours=neighbours)
    return _assignments(items, components, canonical_key or _by_id)


def assign(
    item: DedupItem,
    *,
    index: VectorIndex,
    lookup: Callable[[list[int]], Mapping[int, Member]],
    threshold: float,
    across_tasks: bool = False,
    exact_match: Member | None = None,
    neighbours: int = DEFAULT_NEIGHBOURS,
) -> Assignment:
    """Place one new item among already-clustered ones; does not modify the index.

    `lookup` maps neighbour ids to what the store knows of them (one query for the batch of ids);
    ids it does not return are ignored. `exact_match` is a stored item with the same exact hash, if the
    caller found one (the database has the hash indexed; the vector index does not).
    """
    if not item.exact_hash:
        return Assignment(item.id, item.exact_hash, item.id, 1.0, "canonical")
    if exact_match is not None:
        return Assignment(item.id, exact_match.cluster_key, exact_match.canonical_id, 1.0, "exact")
    match = _nearest_member(item, index, lookup, threshold, across_tasks, neighbours)
    if match is None:
        return Assignment(item.id, item.exact_hash, item.id, 1.0, "canonical")
    score, member = match
    return Assignment(
        item.id,
        member.cluster_key,
        member.canonical_id,
        _similarity_to_canonical(item, member, score, index),
        "near",
    )


class UnionFind:
    """Disjoint sets over 0..n-1 with path halving and union by size."""

    def __init__(self, size: int):
        self.parent = list(range(size))
        self.size = [1] * size

    def find(self, node: int) -> int:
        parent = self.parent
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(self, left: int, right: int) -> None:
        left, right = self.find(left), self.find(right)
        if left == right:
            return
        if self.size[left] < self.size[right]:
            left, right = right, left
        self.parent[right] = left
        self.size[left] += self.size[right]


def _by_id(item: DedupItem) -> int:
    return item.id


def _join_exact(items: Sequence[DedupItem], components: UnionFind) -> None:
    first_with_hash: dict[str, int] = {}
    for position, item in enumerate(items):
        if item.exact_hash:
            components.union(first_with_hash.setdefault(item.exact_hash, position), position)


def _groups(items: Sequence[DedupItem], *, across_tasks: bool) -> Iterable[list[int]]:
    signed = [position for position, item in enumerate(items) if item.exact_hash]
    if across_tasks:
        return [signed]
    by_task: dict[str, list[int]] = defaultdict(list)
    for position in signed:
        by_task[items[position].task_key].append(position)
    return by_task.values()


def _join_near(
    items: Sequence[DedupItem],
    group: list[int],
    components: UnionFind,
    *,
    threshold: float,
    neighbours: int,
) -> None:
    if len(group) < 2:
        return
    vectors = np.stack([items[position].vector for position in group]).astype(np.float32, copy=False)
    pairs = (
        _dense_pairs(vectors, threshold)
        if len(group) <= DENSE_LIMIT
        else _neighbour_pairs(vectors, threshold, neighbours)
    )
    for left, right in pairs:
        components.union(group[left], group[right])


def _dense_pairs(vectors: np.ndarray, threshold: float) -> Iterable[tuple[int, int]]:
    similar = np.triu(vectors @ vectors.T >= threshold, k=1)
    return zip(*np.nonzero(similar), strict=True)


def _neighbour_pairs(vectors: np.ndarray, threshold: float, neighbours: int) -> Iterable[tuple[int, int]]:
    index = VectorIndex(vectors.shape[1])
    positions = np.arange(len(vectors), dtype=np.int64)
    index.rebuild(positions, vectors)
    scores, found = index.search(vectors, neighbours + 1)  # +1: an item finds itself
    rows, columns = np.nonzero((scores >= threshold) & (found >= 0) & (found != positions[:, None]))
    return zip(rows.tolist(), found[rows, columns].tolist(), strict=True)


def _assignments(
    items: Sequence[DedupItem], components: UnionFind, canonical_key: Callable[[DedupItem], Any]
) -> list[Assignment]:
    members: dict[int, list[int]] = defaultdict(list)
    for position in range(len(items)):
        members[components.find(position)].append(position)
    canonical_of: dict[int, int] = {
        root: min(positions, key=lambda position: canonical_key(items[position]))
        for root, positions in members.items()
    }
    return [
        _assignment(items[position], items[canonical_of[components.find(position)]])
        for position in range(len(items))
    ]


def _assignment(item: DedupItem, canonical: DedupItem) -> Assignment:
    if item.id == canonical.id:
        return Assignment(item.id, canonical.exact_hash, canonical.id, 1.0, "canonical")
    if item.exact_hash == canonical.exact_hash:
        return Assignment(item.id, canonical.exact_hash, canonical.id, 1.0, "exact")
    similarity = float(np.dot(item.vector, canonical.vector))
    return Assignment(item.id, canonical.exact_hash, canonical.id, similarity, "near")


def _nearest_member(
    item: DedupItem,
    index: VectorIndex,
    lookup: Callable[[list[int]], Mapping[int, Member]],
    threshold: float,
    across_tasks: bool,
    neighbours: int,
) -> tuple[float, Member] | None:
    """Best neighbour above the threshold in the item's task; widens the search while every
    neighbour found is above the threshold but in another task."""
    k = neighbours
    while True:
        scores, ids = index.search(item.vector, k)
        above = [
            (float(score), int(found))
            for score, found in zip(scores[0], ids[0], strict=True)
            if found >= 0 and score >= threshold
        ]
        candidates = [(score, found) for score, found in above if found != item.id]
        known = lookup([found for _, found in candidates]) if candidates else {}
        for score, found in candidates:  # best first: FAISS returns scores in descending order
            member = known.get(found)
            if member is not None and (across_tasks or member.task_key == item.task_key):
                return score, member
        exhausted = len(above) < k or k >= len(index) or k >= MAX_NEIGHBOURS
        if exhausted:
            return None
        k = min(k * 4, MAX_NEIGHBOURS)


def _similarity_to_canonical(item: DedupItem, member: Member, score: float, index: VectorIndex) -> float:
    if member.canonical_id == member.id:
        return score
    try:
        canonical_vector = index.vectors(np.array([member.canonical_id]))[0]
    except KeyError:  # canonical not cached (removed from the index): the neighbour's score stands in
        return score
    return float(np.dot(item.vector, canonical_vector))
