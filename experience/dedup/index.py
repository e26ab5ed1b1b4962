"""A FAISS inner-product index over unit vectors, keyed by trajectory id: a rebuildable cache.

The vectors of record live in Postgres; this index is derived from them and can always be rebuilt
(`rebuild`) or brought up to date incrementally: `high_water_mark` is the largest id ever added, so the
caller adds the rows with `id > high_water_mark` and saves. Removing an id does not lower the mark (the
database query must not hand back rows the cache dropped on purpose).

Layout, and why:
- Below `exact_threshold` vectors: `IndexIDMap2` over `IndexFlatIP`. Exact, no training, cheap to
  update; at 20,000 x 384 a query is a few milliseconds of brute force.
- Above it: `IndexIVFFlat` (inner product, spherical k-means) with `nlist ≈ 4·sqrt(n)` lists, trained on
  a sample of at most 40 vectors per list (FAISS wants >= 39 per centroid), a hashtable direct map so
  `remove` and `vectors` are by id, and `nprobe` set to twice the smallest power of two whose recall@10
  against brute force, on a sample of the indexed vectors used as queries, reaches `target_recall` (the
  doubling because such queries flatter the index; see `_tune_nprobe`).
- `recall_floor`: with it, tuning counts only true neighbours scoring at least that much. Dedup needs the
  neighbours above its threshold, not the exact order of loosely related runs, and on lexical vectors the
  difference is large (README.md: nprobe 4 instead of 256-1,024 at 100,000 runs). `search(..., nprobe=)`
  overrides the tuned value for one call (a "find similar" page that wants the exact top-k).
- `add` switches flat → IVF when the index outgrows the threshold, retrains the IVF when it has grown 4x
  since training (the lists would be too long for the tuned nprobe), and goes back to flat when removals
  shrink it below half the threshold.

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
MIN_LIST_POINTS = 40  # FAISS warns below 39 training points per centroid
TUNING_QUERIES = 256
TUNING_K = 10
MIN_FLOOR_EVIDENCE = 100  # true neighbours above the floor needed before tuning on the floor alone
KMEANS_ITERATIONS = 10
FORMAT_VERSION = 1


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
        self.trained_size = 0  # vectors the IVF was trained for; 0 while flat
        self.measured_recall: float | None = None  # recall@10 at the chosen nprobe, when IVF
        # Any: FAISS's stubs know neither the SWIG subclasses' fields nor the numpy-friendly wrappers.
        self._index: Any = _new_flat(dim)

    # -- reading -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._index.ntotal)

    @property
    def kind(self) -> str:
        return "ivf" if isinstance(self._index, faiss.IndexIVF) else "flat"

    @property
    def nprobe(self) -> int | None:
        return int(self._index.nprobe) if isinstance(self._index, faiss.IndexIVF) else None

    @property
    def nlist(self) -> int | None:
        return int(self._index.nlist) if isinstance(self._index, faiss.IndexIVF) else None

    def search(
        self, vectors: np.ndarray, k: int, *, nprobe: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: (scores float32 (nq, k), ids int64 (nq, k)); misses are (-inf, -1).

        `nprobe` overrides the tuned value for this call (ignored by the exact layout).
        """
        queries = self._as_matrix(vectors)
        if nprobe is not None and self.kind == "ivf":
            params = faiss.SearchParametersIVF()
            params.nprobe = min(nprobe, self._index.nlist)
            scores, ids = self._index.search(queries, max(1, k), params=params)
        else:
            scores, ids = self._index.search(queries, max(1, k))
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return scores[:, :k], ids[:, :k]

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of these ids, in order. Raises KeyError for an id not in the index."""
        ids = _as_ids(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for row, item in enumerate(ids.tolist()):
            try:
                out[row] = self._index.reconstruct(item)
            except RuntimeError as error:  # FAISS reports an unknown id as a C++ exception
                raise KeyError(item) from error
        return out

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, vectors) held, in no particular order."""
        if isinstance(self._index, faiss.IndexIVF):
            return _ivf_contents(self._index, self.dim)
        ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        vectors = self._index.index.reconstruct_n(0, len(ids)) if len(ids) else np.empty((0, self.dim))
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
        if len(self) and ids.min() <= self.high_water_mark:
            self._index.remove_ids(ids[ids <= self.high_water_mark])  # upsert; new ids cannot be present
        self._index.add_with_ids(vectors, ids)
        self.high_water_mark = max(self.high_water_mark, int(ids.max()))
        self._maybe_relayout()

    def remove(self, ids: np.ndarray) -> int:
        """Drop these ids (absent ones are ignored); returns how many were removed."""
        removed = int(self._index.remove_ids(_as_ids(ids)))
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
        }
        buffer = io.BytesIO()
        np.savez(
            buffer,
            index=faiss.serialize_index(self._index),
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            tmp.write(buffer.getvalue())
        os.replace(tmp.name, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VectorIndex:
        with np.load(Path(path), allow_pickle=False) as archive:
            meta = json.loads(archive["meta"].tobytes().decode())
            raw = archive["index"]
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"index file format {meta.get('format')} is not {FORMAT_VERSION}; rebuild it")
        index = cls(
            meta["dim"],
            exact_threshold=meta["exact_threshold"],
            target_recall=meta["target_recall"],
            recall_floor=meta["recall_floor"],
            seed=meta["seed"],
        )
        index._index = faiss.deserialize_index(raw)
        index.high_water_mark = meta["high_water_mark"]
        index.trained_size = meta["trained_size"]
        index.measured_recall = meta["measured_recall"]
        return index

    # -- layout --------------------------------------------------------------------------------------

    def _maybe_relayout(self) -> None:
        size = len(self)
        if self.kind == "flat" and size > self.exact_threshold:
            self._load_layout(*self.contents())
        elif self.kind == "ivf" and (size > 4 * self.trained_size or size < self.exact_threshold // 2):
            self._load_layout(*self.contents())

    def _load_layout(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) > self.exact_threshold:
            self._index, self.measured_recall = _build_ivf(
                ids, vectors, target_recall=self.target_recall, recall_floor=self.recall_floor, seed=self.seed
            )
            self.trained_size = len(ids)
        else:
            self._index = _new_flat(self.dim)
            if len(ids):
                self._index.add_with_ids(vectors, ids)
            self.trained_size, self.measured_recall = 0, None

    def _as_matrix(self, vectors: np.ndarray) -> np.ndarray:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dim {self.dim}, got shape {np.shape(vectors)}")
        return matrix


def ivf_list_count(size: int) -> int:
    """~4·sqrt(n), but never fewer than MIN_LIST_POINTS training vectors per list."""
    return max(1, min(int(4 * math.sqrt(size)), size // MIN_LIST_POINTS))


def _new_flat(dim: int) -> Any:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def _build_ivf(
    ids: np.ndarray, vectors: np.ndarray, *, target_recall: float, recall_floor: float | None, seed: int
) -> tuple[Any, float]:
    dim = vectors.shape[1]
    nlist = ivf_list_count(len(ids))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.spherical = True  # centroids on the unit sphere, like the data
    index.cp.niter = KMEANS_ITERATIONS
    index.cp.seed = seed
    rng = np.random.default_rng(seed)
    sample_size = min(len(ids), nlist * MIN_LIST_POINTS)
    index.train(vectors[np.sort(rng.choice(len(ids), sample_size, replace=False))])
    index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]  # remove/reconstruct by id
    index.add_with_ids(vectors, ids)
    recall = _tune_nprobe(
        index, ids, vectors, target_recall=target_recall, recall_floor=recall_floor, rng=rng
    )
    return index, recall


def _tune_nprobe(
    index: Any,
    ids: np.ndarray,
    vectors: np.ndarray,
    *,
    target_recall: float,
    recall_floor: float | None,
    rng: np.random.Generator,
) -> float:
    """Set nprobe to twice the smallest power of two reaching the target recall@10 on indexed vectors used
    as queries; returns the recall measured at that smallest one.

    Each query's own id is dropped from both result lists (it would be a free hit). A returned id
    counts when it is in the exact top-10 or scores at least the exact 10th score (ties). With a floor,
    only true neighbours at or above it are wanted — unless the sample holds fewer than
    MIN_FLOOR_EVIDENCE of them, when the plain top-10 is used rather than tune on no evidence.
    """
    rows = rng.choice(len(ids), min(TUNING_QUERIES, len(ids)), replace=False)
    queries, own = vectors[rows], ids[rows]
    truth_scores, truth_ids = _brute_force(vectors, ids, queries, TUNING_K + 1)
    if recall_floor is not None:
        evidence = int(np.sum((truth_scores >= recall_floor) & (truth_ids != own[:, None])))
        if evidence < MIN_FLOOR_EVIDENCE:  # too few close pairs to tune on: fall back to plain top-k
            recall_floor = None
    nprobe = 1
    while True:
        index.nprobe = nprobe
        scores, found = index.search(queries, TUNING_K + 1)
        recall = recall_at_k(found, scores, truth_ids, truth_scores, own=own, k=TUNING_K, floor=recall_floor)
        if recall >= target_recall or nprobe >= index.nlist:
            break
        nprobe = min(nprobe * 2, index.nlist)
    # Indexed vectors flatter the index (their lists were shaped around them): held-out queries measured
    # 0.984 where these said 0.99 at nprobe 1. One more doubling buys the margin for a few lists.
    index.nprobe = min(nprobe * 2, index.nlist)
    return recall


def _brute_force(
    vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    scores, rows = flat.search(queries, k)
    return scores, np.where(rows >= 0, ids[np.maximum(rows, 0)], -1)


def recall_at_k(
    found_ids: np.ndarray,
    found_scores: np.ndarray,
    truth_ids: np.ndarray,
    truth_scores: np.ndarray,
    *,
    k: int,
    own: np.ndarray | None = None,
    floor: float | None = None,
    tolerance: float = 1e-5,
) -> float:
    """Fraction of the exact top-k recovered over all queries (a score tying the exact k-th counts).

    `own`: per query, an id to ignore on both sides (the query itself). `floor`: only true neighbours
    scoring at least this much are wanted (1.0 when no query has any).
    """
    hits = wanted = 0
    for row in range(len(found_ids)):
        skip = -2 if own is None else own[row]
        truth_keep = (truth_ids[row] != skip) & (truth_ids[row] >= 0)
        if floor is not None:
            truth_keep &= truth_scores[row] >= floor
        found_keep = (found_ids[row] != skip) & (found_ids[row] >= 0)
        truth = truth_ids[row][truth_keep][:k]
        if not len(truth):
            continue
        kth_score = truth_scores[row][truth_keep][:k].min()
        got_ids, got_scores = found_ids[row][found_keep][:k], found_scores[row][found_keep][:k]
        hits += min(len(truth), int(np.sum(np.isin(got_ids, truth) | (got_scores >= kth_score - tolerance))))
        wanted += len(truth)
    return hits / wanted if wanted else 1.0


def _ivf_contents(index: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    from faiss.contrib.inspect_tools import get_invlist

    id_parts, vector_parts = [], []
    for list_no in range(index.nlist):
        list_ids, codes = get_invlist(index.invlists, list_no)
        id_parts.append(np.asarray(list_ids, dtype=np.int64))
        vector_parts.append(np.asarray(codes).view(np.float32).reshape(-1, dim))
    if not id_parts:
        return np.empty(0, dtype=np.int64), np.empty((0, dim), dtype=np.float32)
    return np.concatenate(id_parts), np.concatenate(vector_parts)


def _as_ids(ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64)
