"""A FAISS inner-product index over unit vectors, keyed by trajectory id: a rebuildable cache.

The vectors of record live in Postgres; this index is derived from them and can always be rebuilt
(`rebuild`) or brought up to date incrementally: `high_water_mark` is the largest id ever added, so the
caller adds the rows with `id > high_water_mark` and saves. Removing an id does not lower the mark (the
database query must not hand back rows the cache dropped on purpose).

Layout, and why:
- Up to `exact_threshold` vectors: `IndexIDMap2` over `IndexFlatIP`. Exact, no training, cheap to
  update; at 20,000 x 384 a query is a few milliseconds of brute force.
- Above it: `IndexHNSWFlat` (inner product, `HNSW_M` links a node, `EF_CONSTRUCTION`), with the ids in a
  numpy array beside it (graph position → id). Chosen by measurement over IVF: on lexical signature vectors
  the top-10 of a run beyond its near duplicates is a dense band of loosely related runs (cosine 0.6–0.75)
  spread over many IVF lists, so IVF needed a quarter of a million-vector index scanned (28 ms) for 0.96
  plain recall@10; the graph walks that band directly (README.md has the figures).
- HNSW cannot delete a node, so removal is a tombstone: the position is marked dead and searches pass
  FAISS a bitmap selector of the live positions, so a removed id is never returned. An upsert tombstones
  the old position and appends. When tombstones pass `TOMBSTONE_FRACTION` of the graph, it is rebuilt
  from the live vectors (`contents`).
- `ef_search` is tuned at build time: the smallest power of two (from `MIN_EF_SEARCH`) whose plain
  recall@10 against brute force reaches `target_recall` on `TUNING_QUERIES` vectors held out of the graph
  while it is built (then added), times `EF_MARGIN` for the sampling error of 256 queries. Held out
  because a vector already in the graph flatters it: the walk lands on the query's own node, whose links
  are its neighbours. With `recall_floor`, the recall of the true neighbours scoring at least the floor
  (what dedup needs) must reach the target too. `search(..., ef_search=)` overrides it for one call.
- `add` switches flat → HNSW when the index outgrows the threshold, rebuilds (and re-tunes) the graph when
  it has grown 4x since the last build, and goes back to flat when removals shrink it below half the
  threshold.

`add` is an upsert: an id already present is replaced. Not safe for concurrent writers; one process owns
the file and others load copies.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import faiss
import numpy as np

DEFAULT_EXACT_THRESHOLD = 20_000
DEFAULT_TARGET_RECALL = 0.99
HNSW_M = 32
EF_CONSTRUCTION = 80
MIN_EF_SEARCH = 16
MAX_EF_SEARCH = 2048
EF_MARGIN = 1.5
TUNING_QUERIES = 256
TUNING_K = 10
MIN_FLOOR_EVIDENCE = 100  # true neighbours above the floor needed before the floor is tuned on
TOMBSTONE_FRACTION = 0.2
GROWTH_BEFORE_RETUNE = 4
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
        self.trained_size = 0  # vectors the graph was built and tuned for; 0 while flat
        self.measured_recall: float | None = None  # held-out plain recall@10 at the tuned ef, when HNSW
        # Any: FAISS's stubs know neither the SWIG subclasses' fields nor the numpy-friendly wrappers.
        self._index: Any = _new_flat(dim)
        self._graph: _Graph | None = None  # the HNSW layout's bookkeeping; None while flat

    # -- reading -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._graph.live if self._graph is not None else int(self._index.ntotal)

    @property
    def kind(self) -> str:
        return "flat" if self._graph is None else "hnsw"

    @property
    def ef_search(self) -> int | None:
        return int(self._index.hnsw.efSearch) if self._graph is not None else None

    @property
    def tombstones(self) -> int:
        return self._graph.dead if self._graph is not None else 0

    def search(
        self, vectors: np.ndarray, k: int, *, ef_search: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product: (scores float32 (nq, k), ids int64 (nq, k)); misses are (-inf, -1).

        `ef_search` overrides the tuned value for this call (ignored by the exact layout).
        """
        queries, k = self._as_matrix(vectors), max(1, k)
        if self._graph is None:
            scores, ids = self._index.search(queries, k)
        else:
            scores, ids = self._graph.search(self._index, queries, k, ef_search)
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return scores, ids

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of these ids, in order. Raises KeyError for an id not in the index."""
        ids = _as_ids(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        where = self._graph.positions(ids) if self._graph is not None else None
        for row, item in enumerate(ids.tolist()):
            try:
                out[row] = self._index.reconstruct(item if where is None else where[item])
            except (RuntimeError, KeyError) as error:  # FAISS reports an unknown id as a C++ exception
                raise KeyError(item) from error
        return out

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, vectors) held, in no particular order."""
        if self._graph is not None:
            return self._graph.contents(self._index)
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
        replaced = ids[ids <= self.high_water_mark]  # upsert; ids above the mark cannot be present
        if self._graph is not None:
            self._graph.kill(replaced)
            self._graph.append(self._index, ids, vectors)
        else:
            if len(replaced):
                self._index.remove_ids(replaced)
            self._index.add_with_ids(vectors, ids)
        self.high_water_mark = max(self.high_water_mark, int(ids.max()))
        self._maybe_relayout()

    def remove(self, ids: np.ndarray) -> int:
        """Drop these ids (absent ones are ignored); returns how many were removed."""
        ids = _as_ids(ids)
        removed = self._graph.kill(ids) if self._graph is not None else int(self._index.remove_ids(ids))
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
        graph = self._graph or _Graph(np.empty(0, dtype=np.int64))
        buffer = io.BytesIO()
        np.savez(
            buffer,
            index=faiss.serialize_index(self._index),
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            labels=graph.labels,
            alive=graph.alive,
        )
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
            raw, labels, alive = archive["index"], archive["labels"], archive["alive"]
        index = cls(
            meta["dim"],
            exact_threshold=meta["exact_threshold"],
            target_recall=meta["target_recall"],
            recall_floor=meta["recall_floor"],
            seed=meta["seed"],
        )
        index._index = faiss.deserialize_index(raw)
        index._graph = _Graph(labels, alive) if meta["kind"] == "hnsw" else None
        index.high_water_mark = meta["high_water_mark"]
        index.trained_size = meta["trained_size"]
        index.measured_recall = meta["measured_recall"]
        return index

    # -- layout --------------------------------------------------------------------------------------

    def _maybe_relayout(self) -> None:
        size, graph = len(self), self._graph
        if graph is None:
            if size > self.exact_threshold:
                self._load_layout(*self.contents())
        elif (
            size < self.exact_threshold // 2
            or size > GROWTH_BEFORE_RETUNE * self.trained_size
            or graph.dead > TOMBSTONE_FRACTION * len(graph.labels)
        ):
            self._load_layout(*self.contents())

    def _load_layout(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) > self.exact_threshold:
            self._index, self._graph, self.measured_recall = _build_hnsw(
                ids, vectors, target_recall=self.target_recall, recall_floor=self.recall_floor, seed=self.seed
            )
            self.trained_size = len(ids)
        else:
            self._index, self._graph = _new_flat(self.dim), None
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


class _Graph:
    """The ids and tombstones of an HNSW layout: position i of the graph holds id labels[i], live or not."""

    def __init__(self, labels: np.ndarray, alive: np.ndarray | None = None):
        self.labels = np.asarray(labels, dtype=np.int64)
        self.alive = np.ones(len(self.labels), dtype=bool) if alive is None else np.asarray(alive, dtype=bool)
        self.live = int(self.alive.sum())
        self._bitmap: np.ndarray | None = None  # packed `alive` for FAISS's selector; None when stale

    @property
    def dead(self) -> int:
        return len(self.labels) - self.live

    def search(
        self, index: Any, queries: np.ndarray, k: int, ef_search: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(ef_search or int(index.hnsw.efSearch), k)
        if self.dead:  # only live positions may be returned; the walk still passes through dead ones
            if self._bitmap is None:
                self._bitmap = np.packbits(self.alive, bitorder="little")
            selector = faiss.IDSelectorBitmap(len(self.alive), faiss.swig_ptr(self._bitmap))
            params.sel = selector  # `selector` stays referenced until the search returns
        scores, positions = index.search(queries, k, params=params)
        return scores, np.where(positions >= 0, self.labels[np.maximum(positions, 0)], -1)

    def positions(self, ids: np.ndarray) -> dict[int, int]:
        """id → graph position, for the live ones among `ids`."""
        found = np.flatnonzero(self.alive & np.isin(self.labels, ids))
        return dict(zip(self.labels[found].tolist(), found.tolist(), strict=True))

    def kill(self, ids: np.ndarray) -> int:
        """Tombstone the live positions of these ids; returns how many."""
        if not len(ids) or not self.live:
            return 0
        found = np.flatnonzero(self.alive & np.isin(self.labels, ids))
        self.alive[found] = False
        self.live -= len(found)
        self._bitmap = None
        return len(found)

    def append(self, index: Any, ids: np.ndarray, vectors: np.ndarray) -> None:
        index.add(vectors)
        self.labels = np.concatenate([self.labels, ids])
        self.alive = np.concatenate([self.alive, np.ones(len(ids), dtype=bool)])
        self.live += len(ids)
        self._bitmap = None

    def contents(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        live = np.flatnonzero(self.alive)
        vectors = index.reconstruct_n(0, len(self.labels))[live] if len(live) else np.empty((0, index.d))
        return self.labels[live], np.asarray(vectors, dtype=np.float32).reshape(-1, index.d)


def _new_flat(dim: int) -> Any:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def _build_hnsw(
    ids: np.ndarray, vectors: np.ndarray, *, target_recall: float, recall_floor: float | None, seed: int
) -> tuple[Any, _Graph, float]:
    """The graph over all vectors, ef_search tuned on a sample held out of it until the tuning is done."""
    index = faiss.IndexHNSWFlat(vectors.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    rng = np.random.default_rng(seed)
    held = np.zeros(len(ids), dtype=bool)
    held[rng.choice(len(ids), min(TUNING_QUERIES, len(ids) // 10), replace=False)] = True
    graph = _Graph(np.empty(0, dtype=np.int64))
    graph.append(index, ids[~held], vectors[~held])
    recall = _tune_ef_search(
        index, vectors[~held], vectors[held], target_recall=target_recall, recall_floor=recall_floor
    )
    graph.append(index, ids[held], vectors[held])
    return index, graph, recall


def _tune_ef_search(
    index: Any, indexed: np.ndarray, queries: np.ndarray, *, target_recall: float, recall_floor: float | None
) -> float:
    """Set efSearch to EF_MARGIN x the smallest power of two reaching the target recall@10 of `queries`
    (not in the graph) against brute force over `indexed` (the graph's vectors, by position); returns the
    recall measured at that smallest one.

    With a floor, the true neighbours at or above it must reach the target too — unless the sample holds
    fewer than MIN_FLOOR_EVIDENCE of them (no evidence to tune on; the plain top-10 decides alone).
    """
    truth_scores, truth_ids = faiss.knn(queries, indexed, TUNING_K, metric=faiss.METRIC_INNER_PRODUCT)
    if recall_floor is not None and np.sum(truth_scores >= recall_floor) < MIN_FLOOR_EVIDENCE:
        recall_floor = None
    ef = MIN_EF_SEARCH
    while True:
        index.hnsw.efSearch = ef
        scores, found = index.search(queries, TUNING_K)
        recall = recall_at_k(found, scores, truth_ids, truth_scores, k=TUNING_K)
        floor_recall = (
            recall_at_k(found, scores, truth_ids, truth_scores, k=TUNING_K, floor=recall_floor)
            if recall_floor is not None
            else 1.0
        )
        if min(recall, floor_recall) >= target_recall or ef >= MAX_EF_SEARCH:
            break
        ef *= 2
    index.hnsw.efSearch = int(ef * EF_MARGIN)
    return recall


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


def _as_ids(ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64)
