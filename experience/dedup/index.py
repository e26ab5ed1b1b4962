"""A FAISS inner-product index over unit vectors, keyed by trajectory id: a rebuildable cache.

The vectors of record live in Postgres; this index is derived from them and can always be rebuilt
(`rebuild`) or brought up to date incrementally: `high_water_mark` is the largest id ever added, so the
caller adds the rows with `id > high_water_mark` and saves. Removing an id does not lower the mark (the
database query must not hand back rows the cache dropped on purpose).

Layout, and why:
- Up to `exact_threshold` vectors: `IndexIDMap2` over `IndexFlatIP`. Exact, no training, cheap to
  update; at 20,000 x 384 a query is a few milliseconds of brute force.
- Above it, a compressed scan with exact re-ranking: every vector is also coded with a 4-bit product
  quantizer (`IndexPQFastScan`, one sub-quantizer per 4 dimensions: 48 bytes for 384), a query scans all
  the codes (SIMD lookups, ~2 ms at a million on one core) for its `rerank` best candidates, and those are
  re-scored exactly against the float vectors (kept in an `IndexFlatIP`, by position, with the ids in a
  numpy array beside it). Chosen by measurement (README.md): on lexical signature vectors the top-10 of a
  run beyond its near duplicates is a dense band of loosely related runs (cosine 0.6–0.75) spread over
  the whole collection, which partitions (IVF: 0.96 plain recall@10 at 28 ms) and graphs (HNSW: 0.977 at
  16 ms, 16 minutes to build) both miss; a scan cannot, and the quantizer's error is small next to the
  gap between a query's 10th and 100th neighbour. It builds in well under a minute at a million.
- Removal is a tombstone (the codes cannot be deleted in place): the position is marked dead and dropped
  before re-ranking, and the candidate count grows with the dead fraction so a removal does not cost
  recall. An upsert tombstones the old position and appends. Past `TOMBSTONE_FRACTION` dead positions the
  layout is rebuilt from the live vectors (`contents`).
- `rerank` is tuned at build time: the smallest count on a x1.25 grid (from `MIN_RERANK`) whose plain
  recall@10 against brute force reaches `target_recall` on `TUNING_QUERIES` vectors held out of the
  index until the tuning is done (then added), times `RERANK_MARGIN` for the sampling error of 256
  queries. With `recall_floor`, the recall of the true neighbours scoring at least the floor (what dedup
  needs) must reach the target too. A search for k > 10 re-ranks k/10 times as many;
  `search(..., rerank=)` overrides the count for one call.
- `add` switches flat → scan when the index outgrows the threshold, rebuilds (retrains the quantizer,
  re-tunes) when it has doubled since the last build (until then the count grows in step with it), and
  goes back to flat when removals shrink it below half the threshold.

`add` is an upsert: an id already present is replaced. Not safe for concurrent writers; one process owns
the file and others load copies.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import faiss
import numpy as np

DEFAULT_EXACT_THRESHOLD = 20_000
DEFAULT_TARGET_RECALL = 0.99
DIMS_PER_SUBQUANTIZER = 4  # 4-bit codes: 48 bytes a 384-dim vector
QUANTIZER_TRAINING_SAMPLE = 65_536
MIN_RERANK = 32
MAX_RERANK = 32_768
RERANK_STEP = 1.25
RERANK_MARGIN = 1.5
TUNING_QUERIES = 256
TUNING_K = 10
MIN_FLOOR_EVIDENCE = 100  # true neighbours above the floor needed before the floor is tuned on
TOMBSTONE_FRACTION = 0.2
GROWTH_BEFORE_RETUNE = 2
FORMAT_VERSION = 2


class VectorIndex:
    def __init__(
        self,
        dim: int,
        *,
        exact_threshold: int = DEFAULT_EXACT_THRESHOLD,
        target_recall: float = DEFAULT_TARGET_RECALL,
        recall_floor: float | None = None,
        seed: int = 0,
    ):
        self.dim = dim
        self.exact_threshold = exact_threshold
        self.target_recall = target_recall
        self.recall_floor = recall_floor
        self.seed = seed
        self.high_water_mark = -1
        self.trained_size = 0  # vectors the scan was built and tuned for; 0 while flat
        self.measured_recall: float | None = None  # held-out plain recall@10 at the tuned count, when scan
        # Any: FAISS's stubs know neither the SWIG subclasses' fields nor the numpy-friendly wrappers.
        self._flat: Any = _new_flat(dim)  # the exact layout; None while the scan layout is in use
        self._scan: _Scan | None = None

    # -- reading -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._scan.live if self._scan is not None else int(self._flat.ntotal)

    @property
    def kind(self) -> str:
        return "flat" if self._scan is None else "scan"

    @property
    def rerank(self) -> int | None:
        """Candidates re-scored exactly for a top-10 (tuned), when the layout is the scan."""
        return self._scan.rerank if self._scan is not None else None

    @property
    def tombstones(self) -> int:
        return self._scan.dead if self._scan is not None else 0

    def search(
        self, vectors: np.ndarray, k: int, *, rerank: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: (scores float32 (nq, k), ids int64 (nq, k)); misses are (-inf, -1).

        `rerank` overrides the tuned candidate count for this call (ignored by the exact layout).
        """
        queries, k = self._as_matrix(vectors), max(1, k)
        if self._scan is None:
            scores, ids = self._flat.search(queries, k)
        else:
            scores, ids = self._scan.search(queries, k, rerank)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return scores, ids

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of these ids, in order. Raises KeyError for an id not in the index."""
        ids = _as_ids(ids)
        if self._scan is not None:
            return self._scan.vectors(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for row, item in enumerate(ids.tolist()):
            try:
                out[row] = self._flat.reconstruct(item)
            except RuntimeError as error:  # FAISS reports an unknown id as a C++ exception
                raise KeyError(item) from error
        return out

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, vectors) held, in no particular order."""
        if self._scan is not None:
            return self._scan.contents()
        ids = faiss.vector_to_array(self._flat.id_map).astype(np.int64)
        vectors = self._flat.index.reconstruct_n(0, len(ids)) if len(ids) else np.empty((0, self.dim))
        return ids, np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)

    # -- writing -------------------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Insert or replace these ids; may switch layout (see the module docstring)."""
        ids, vectors = _as_ids(ids), self._as_matrix(vectors)
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids for {len(vectors)} vectors")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids must be unique within one add")
        if not len(ids):
            return
        replaced = ids[ids <= self.high_water_mark]  # upsert; ids above the mark cannot be present
        if self._scan is not None:
            self._scan.kill(replaced)
            self._scan.append(ids, vectors)
        else:
            if len(replaced):
                self._flat.remove_ids(replaced)
            self._flat.add_with_ids(vectors, ids)
        self.high_water_mark = max(self.high_water_mark, int(ids.max()))
        self._maybe_relayout()

    def remove(self, ids: np.ndarray) -> int:
        """Drop these ids (absent ones are ignored); returns how many were removed."""
        ids = _as_ids(ids)
        removed = self._scan.kill(ids) if self._scan is not None else int(self._flat.remove_ids(ids))
        self._maybe_relayout()
        return removed

    def rebuild(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Replace the whole content, choosing the layout for its size; the mark becomes max(ids)."""
        ids, vectors = _as_ids(ids), self._as_matrix(vectors)
        if len(ids) != len(vectors) or len(np.unique(ids)) != len(ids):
            raise ValueError("rebuild needs one vector per id and unique ids")
        self._load_layout(ids, vectors)
        self.high_water_mark = int(ids.max()) if len(ids) else -1

    # -- persistence ---------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write index and metadata to one file, atomically (readers never see half a file)."""
        path = Path(path)
        meta = {
            "format": FORMAT_VERSION,
            "dim": self.dim,
            "exact_threshold": self.exact_threshold,
            "target_recall": self.target_recall,
            "recall_floor": self.recall_floor,
            "seed": self.seed,
            "high_water_mark": self.high_water_mark,
            "trained_size": self.trained_size,
            "measured_recall": self.measured_recall,
            "kind": self.kind,
        }
        parts = self._scan.parts() if self._scan is not None else {"flat": faiss.serialize_index(self._flat)}
        meta["rerank"] = self.rerank
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp.write(buffer.getvalue())
        os.replace(tmp.name, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VectorIndex:
        with np.load(Path(path), allow_pickle=False) as archive:
            meta = json.loads(archive["meta"].tobytes().decode())
            if meta.get("format") != FORMAT_VERSION:
                raise ValueError(f"index file format {meta.get('format')} is not {FORMAT_VERSION}; rebuild it")
            parts = {name: archive[name] for name in archive.files if name != "meta"}
        index = cls(
            meta["dim"],
            exact_threshold=meta["exact_threshold"],
            target_recall=meta["target_recall"],
            recall_floor=meta["recall_floor"],
            seed=meta["seed"],
        )
        if meta["kind"] == "scan":
            index._flat, index._scan = None, _Scan.from_parts(parts, rerank=meta["rerank"])
        else:
            index._flat = faiss.deserialize_index(parts["flat"])
        index.high_water_mark = meta["high_water_mark"]
        index.trained_size = meta["trained_size"]
        index.measured_recall = meta["measured_recall"]
        return index

    # -- layout --------------------------------------------------------------------------------------

    def _maybe_relayout(self) -> None:
        size, scan = len(self), self._scan
        if scan is None:
            if size > self.exact_threshold:
                self._load_layout(*self.contents())
        elif (
            size < self.exact_threshold // 2
            or size > GROWTH_BEFORE_RETUNE * self.trained_size
            or scan.dead > TOMBSTONE_FRACTION * len(scan.labels)
        ):
            self._load_layout(*self.contents())

    def _load_layout(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) > self.exact_threshold:
            self._scan, self.measured_recall = _build_scan(
                ids, vectors, target_recall=self.target_recall, recall_floor=self.recall_floor, seed=self.seed
            )
            self._flat, self.trained_size = None, len(ids)
        else:
            self._flat, self._scan = _new_flat(self.dim), None
            if len(ids):
                self._flat.add_with_ids(vectors, ids)
            self.trained_size, self.measured_recall = 0, None

    def _as_matrix(self, vectors: np.ndarray) -> np.ndarray:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dim {self.dim}, got shape {np.shape(vectors)}")
        return matrix


class _Scan:
    """The scan layout: PQ codes (scanned), float vectors (re-ranked), and per position its id and
    whether it is live. Position i of `codes` and of `store` hold the vector of id labels[i]."""

    def __init__(
        self, codes: Any, store: Any, labels: np.ndarray, alive: np.ndarray, rerank: int, tuned_for: int
    ):
        self.codes, self.store, self.rerank = codes, store, rerank
        self.tuned_for = tuned_for  # live vectors when `rerank` was tuned
        self.labels = np.asarray(labels, dtype=np.int64)
        self.alive = np.asarray(alive, dtype=bool)
        self.live = int(self.alive.sum())

    @classmethod
    def empty(cls, codes: Any, dim: int) -> _Scan:
        return cls(codes, faiss.IndexFlatIP(dim), np.empty(0, dtype=np.int64), np.empty(0, dtype=bool), 0, 0)

    @property
    def dead(self) -> int:
        return len(self.labels) - self.live

    def search(self, queries: np.ndarray, k: int, rerank: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The best `wanted` candidates by code, the dead dropped, the rest re-scored exactly.

        The tuned count grows in step with the live vectors since tuning: with more vectors, more of them
        crowd a true neighbour's place among the candidates (a 7,500-vector tuning measured 0.91 at 30,000).
        """
        if rerank is None:
            rerank = math.ceil(self.rerank * max(1.0, self.live / max(self.tuned_for, 1)))
        wanted = rerank * max(k, TUNING_K) // TUNING_K
        wanted = min(len(self.labels), max(k, math.ceil(wanted * len(self.labels) / max(self.live, 1))))
        _, candidates = self.codes.search(queries, wanted)
        stored = self._stored()
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_ids = np.full((len(queries), k), -1, dtype=np.int64)
        for row, positions in enumerate(candidates):
            positions = positions[positions >= 0]
            positions = positions[self.alive[positions]]
            scores = stored[positions] @ queries[row]
            best = np.argsort(-scores, kind="stable")[:k]
            out_scores[row, : len(best)] = scores[best]
            out_ids[row, : len(best)] = self.labels[positions[best]]
        return out_scores, out_ids

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        where = self._positions(ids)
        missing = [item for item in ids.tolist() if item not in where]
        if missing:
            raise KeyError(missing[0])
        return self._stored()[[where[item] for item in ids.tolist()]].copy()

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        live = np.flatnonzero(self.alive)
        return self.labels[live], self._stored()[live].copy()

    def kill(self, ids: np.ndarray) -> int:
        """Tombstone the live positions of these ids; returns how many."""
        if not len(ids) or not self.live:
            return 0
        found = self._live_positions(ids)
        self.alive[found] = False
        self.live -= len(found)
        return len(found)

    def append(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.codes.add(vectors)
        self.store.add(vectors)
        self.labels = np.concatenate([self.labels, ids])
        self.alive = np.concatenate([self.alive, np.ones(len(ids), dtype=bool)])
        self.live += len(ids)

    def parts(self) -> dict[str, np.ndarray]:
        return {
            "codes": faiss.serialize_index(self.codes),
            "store": faiss.serialize_index(self.store),
            "labels": self.labels,
            "alive": self.alive,
            "tuned_for": np.array([self.tuned_for], dtype=np.int64),
        }

    @classmethod
    def from_parts(cls, parts: dict[str, np.ndarray], *, rerank: int) -> _Scan:
        codes, store = faiss.deserialize_index(parts["codes"]), faiss.deserialize_index(parts["store"])
        return cls(codes, store, parts["labels"], parts["alive"], rerank, int(parts["tuned_for"][0]))

    def _positions(self, ids: np.ndarray) -> dict[int, int]:
        """id → position, for the live ones among `ids`."""
        found = self._live_positions(ids)
        return dict(zip(self.labels[found].tolist(), found.tolist(), strict=True))

    def _live_positions(self, ids: np.ndarray) -> np.ndarray:
        return np.flatnonzero(self.alive & np.isin(self.labels, ids))

    def _stored(self) -> np.ndarray:
        """The float vectors by position: a view of FAISS's buffer, valid until the next append."""
        count, dim = int(self.store.ntotal), int(self.store.d)
        if not count:
            return np.empty((0, dim), dtype=np.float32)
        return faiss.rev_swig_ptr(self.store.get_xb(), count * dim).reshape(count, dim)


def _new_flat(dim: int) -> Any:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def subquantizer_count(dim: int) -> int:
    """One sub-quantizer per DIMS_PER_SUBQUANTIZER dimensions, rounded down to a divisor of `dim`."""
    count = max(1, dim // DIMS_PER_SUBQUANTIZER)
    while dim % count:
        count -= 1
    return count


def _build_scan(
    ids: np.ndarray, vectors: np.ndarray, *, target_recall: float, recall_floor: float | None, seed: int
) -> tuple[_Scan, float]:
    """Codes and vectors of all ids; `rerank` tuned on a sample held out of them until the tuning is done."""
    dim = vectors.shape[1]
    rng = np.random.default_rng(seed)
    held = np.zeros(len(ids), dtype=bool)
    held[rng.choice(len(ids), min(TUNING_QUERIES, len(ids) // 10), replace=False)] = True
    indexed = np.flatnonzero(~held)
    codes = faiss.IndexPQFastScan(dim, subquantizer_count(dim), 4, faiss.METRIC_INNER_PRODUCT)
    sample = rng.choice(indexed, min(QUANTIZER_TRAINING_SAMPLE, len(indexed)), replace=False)
    codes.train(vectors[np.sort(sample)])
    scan = _Scan.empty(codes, dim)
    scan.append(ids[indexed], vectors[indexed])
    recall = _tune_rerank(
        scan, vectors[indexed], vectors[held], target_recall=target_recall, recall_floor=recall_floor
    )
    scan.append(ids[held], vectors[held])
    return scan, recall


def _tune_rerank(
    scan: _Scan, indexed: np.ndarray, queries: np.ndarray, *, target_recall: float, recall_floor: float | None
) -> float:
    """Set scan.rerank to RERANK_MARGIN x the smallest count (MIN_RERANK x 1.25^i) reaching the target
    recall@10 of `queries` (held out of the scan) against brute force over `indexed`; returns the recall
    measured at that smallest count.

    With a floor, the true neighbours at or above it must reach the target too — unless the sample holds
    fewer than MIN_FLOOR_EVIDENCE of them (no evidence to tune on; the plain top-10 decides alone).
    """
    truth_scores, truth_rows = faiss.knn(queries, indexed, TUNING_K, metric=faiss.METRIC_INNER_PRODUCT)
    truth_ids = np.where(truth_rows >= 0, scan.labels[np.maximum(truth_rows, 0)], -1)
    if recall_floor is not None and np.sum(truth_scores >= recall_floor) < MIN_FLOOR_EVIDENCE:
        recall_floor = None
    rerank = MIN_RERANK
    while True:
        scores, found = scan.search(queries, TUNING_K, rerank)
        recall = recall_at_k(found, scores, truth_ids, truth_scores, k=TUNING_K)
        floor_recall = (
            recall_at_k(found, scores, truth_ids, truth_scores, k=TUNING_K, floor=recall_floor)
            if recall_floor is not None
            else 1.0
        )
        if min(recall, floor_recall) >= target_recall or rerank >= MAX_RERANK:
            break
        rerank = math.ceil(rerank * RERANK_STEP)
    scan.rerank, scan.tuned_for = math.ceil(rerank * RERANK_MARGIN), scan.live
    return recall


def recall_at_k(
    found_ids: np.ndarray,
    found_scores: np.ndarray,
    truth_ids: np.ndarray,
    truth_scores: np.ndarray,
    *,
    k: int,
    floor: float | None = None,
    tolerance: float = 1e-5,
) -> float:
    """Fraction of the exact top-k recovered over all queries (a score tying the exact k-th counts).

    `floor`: only true neighbours scoring at least this much are wanted (1.0 when no query has any).
    """
    hits = wanted = 0
    for row in range(len(found_ids)):
        truth_keep = truth_ids[row] >= 0
        if floor is not None:
            truth_keep &= truth_scores[row] >= floor
        found_keep = found_ids[row] >= 0
        truth = truth_ids[row][truth_keep][:k]
        if not len(truth):
            continue
        kth_score = truth_scores[row][truth_keep][:k].min()
        got_ids, got_scores = found_ids[row][found_keep][:k], found_scores[row][found_keep][:k]
        hits += min(len(truth), int(np.sum(np.isin(got_ids, truth) | (got_scores >= kth_score - tolerance))))
        wanted += len(truth)
    return hits / wanted if wanted else 1.0


def _as_ids(ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64)
