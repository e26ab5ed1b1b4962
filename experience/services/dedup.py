"""Dedup in the store: embed finished runs, keep the FAISS cache current, mark duplicates, curate clusters.

The algorithms live in experience.dedup (no ORM); this module reads rows, calls them and writes back.

- `trajectory_dedup(trajectory_ids=)`: per finished run, the exact hash (`content_hash`), the signature's
  embedding (a `TrajectoryEmbedding` row per embedder), then its place: the cluster of an exact duplicate of
  the same task, else of its nearest neighbour at or above the embedder's calibrated threshold (same task
  unless `across_tasks`), else none. Duplicates get cluster, canonical and similarity; nothing is deleted.
  Idempotent: a run already in a cluster keeps it, an unchanged signature is not embedded again.
- The FAISS index (experience.dedup.index.VectorIndex) is a cache of the embedding rows, keyed by
  `TrajectoryEmbedding.id`, one file per embedder and version under TROVE_INDEX_DIR. Its high-water mark is
  the largest embedding id it holds: `index_refresh` adds the rows above it. Embedding ids, not trajectory
  ids, because runs finish out of order: a rollout opened first may finish (and be embedded) last.
- One writer at a time: placing runs and saving the index happen under a Postgres advisory lock (a thread
  lock on SQLite), so two workers cannot each start a cluster for two copies of one run, or save over each
  other's index. Readers (`similar_runs`) use an in-process copy, reloaded when the file changes; the file
  is replaced atomically (temp file + rename, in VectorIndex.save).
- `dedup_rebuild`: re-embed, rebuild the index from the rows, and re-cluster every automatic cluster in one
  batch (single linkage, canonical = earliest run). Clusters a curator touched (`method=manual`) are kept.
- `cluster_split` / `cluster_merge`: a curator's corrections, each change a CurationEvent (who, when, why).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from experience.dedup.cluster import Assignment, DedupItem, Member, assign, cluster_items
from experience.dedup.embed import DEFAULT_EMBEDDER, Embedder, get_embedder
from experience.dedup.index import VectorIndex
from experience.dedup.signature import ACTION_KINDS, action_sequence, exact_hash, signature_text
from experience.errors import NotFound, ValidationError
from experience.models import CurationEvent, DedupCluster, Step, Trajectory, TrajectoryEmbedding
from experience.records import TrajectoryRecord
from experience.services.bulk import is_postgres
from experience.services.stored import record_of, stored_step_records

logger = logging.getLogger(__name__)

PENDING_BATCH = 200  # runs per dedup_pending call: a beat tick stays short
MAX_SIMILAR_K = 1024
_LOCK_KEY = 0x7472_6F76_6564_7570  # "trovedup": the advisory lock of the one dedup writer
_THREAD_LOCK = threading.RLock()


@dataclass
class DedupReport:
    embedded: int = 0  # embedding rows written (new or changed signature)
    placed: int = 0  # runs given a place (a cluster, or confirmed unique)
    duplicates: int = 0  # runs marked duplicate by this call
    skipped: int = 0  # runs not finished or unknown
    trajectory_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("embedded", "placed", "duplicates", "skipped")}


# --- the embedder ------------------------------------------------------------------------------------------


def dedup_embedder(name: str | None = None) -> Embedder:
    """The embedder of that name (default: TROVE_DEDUP_EMBEDDER, else lexical, see experience/dedup/README.md).

    MiniLM needs torch and its weights; if it cannot load, dedup carries on with lexical and says so, since
    a missing model must not stop runs being stored and deduplicated.
    """
    name = name or getattr(settings, "TROVE_DEDUP_EMBEDDER", "") or DEFAULT_EMBEDDER
    embedder = get_embedder(name)
    if embedder.name == DEFAULT_EMBEDDER:
        return embedder
    try:
        embedder.embed(["warm-up"])  # loads the model once per process
    except Exception as error:  # noqa: BLE001  (any load failure: missing package, weights, torch)
        message = f"dedup: embedder {name!r} failed to load ({error}); falling back to {DEFAULT_EMBEDDER}"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
        return get_embedder(DEFAULT_EMBEDDER)
    return embedder


def _resolve(embedder: Embedder | str | None) -> Embedder:
    return dedup_embedder(embedder) if embedder is None or isinstance(embedder, str) else embedder


def embedder_key(embedder: Embedder) -> str:
    """What `TrajectoryEmbedding.embedder` holds: name and version, so a new version re-embeds."""
    return f"{embedder.name}:{embedder.version}"


# --- embedding runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Signed:
    trajectory: Trajectory
    content_hash: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _finished(trajectory_ids: Iterable[int]) -> list[Trajectory]:
    ids = sorted({int(i) for i in trajectory_ids})
    rows = Trajectory.objects.filter(pk__in=ids).exclude(status=Trajectory.Status.RUNNING)
    return list(rows.order_by("id"))


def _action_records(trajectories: list[Trajectory]) -> Iterator[tuple[Trajectory, TrajectoryRecord]]:
    """Each run as a record of its action-bearing steps only (no observations, no model context)."""
    by_run: dict[int, list[Step]] = defaultdict(list)
    steps = Step.objects.filter(trajectory_id__in=[t.pk for t in trajectories], kind__in=ACTION_KINDS)
    for step in steps.order_by("trajectory_id", "seq"):
        by_run[step.trajectory_id].append(step)
    for trajectory in trajectories:
        yield trajectory, record_of(trajectory, stored_step_records(by_run[trajectory.pk], context=False))


def _signed(trajectories: list[Trajectory]) -> list[_Signed]:
    signed = []
    for trajectory, record in _action_records(trajectories):
        actions = action_sequence(record)
        signed.append(_Signed(trajectory, exact_hash(record, actions=actions), signature_text(record, actions=actions)))
    return signed


def _embed(signed: list[_Signed], embedder: Embedder) -> int:
    """Write content hashes and embedding rows; returns how many rows were (re)written.

    A changed signature gets a new row (a new id, above the index's mark) rather than an update, so the
    cache picks it up incrementally; the old id left in the cache maps to no row and is ignored.
    """
    key = embedder_key(embedder)
    known = dict(TrajectoryEmbedding.objects.filter(
        trajectory_id__in=[s.trajectory.pk for s in signed], embedder=key).values_list("trajectory_id", "signature_sha256"))
    stale = [s for s in signed if known.get(s.trajectory.pk) != s.sha256]
    _write_hashes([s for s in signed if s.trajectory.content_hash != s.content_hash])
    if not stale:
        return 0
    vectors = embedder.embed([s.text for s in stale])
    with transaction.atomic():
        TrajectoryEmbedding.objects.filter(trajectory_id__in=[s.trajectory.pk for s in stale], embedder=key).delete()
        TrajectoryEmbedding.objects.bulk_create([
            TrajectoryEmbedding(trajectory_id=s.trajectory.pk, embedder=key, dim=embedder.dim,
                                vector=np.asarray(v, dtype=np.float32).tobytes(), signature_sha256=s.sha256)
            for s, v in zip(stale, vectors, strict=True)
        ])
    return len(stale)


def _write_hashes(changed: list[_Signed]) -> None:
    for item in changed:
        Trajectory.objects.filter(pk=item.trajectory.pk).update(content_hash=item.content_hash)
        item.trajectory.content_hash = item.content_hash


def _vector(raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(bytes(raw), dtype=np.float32)


# --- the index cache ---------------------------------------------------------------------------------------


def index_path(embedder: Embedder) -> Path:
    version = "".join(c if c.isalnum() or c in "-_." else "_" for c in embedder.version)
    return Path(settings.TROVE_INDEX_DIR) / f"dedup-{embedder.name}-{version}.npz"


_CACHE: dict[Path, tuple[int, VectorIndex]] = {}  # path -> (file mtime_ns, index): one copy per process


def _cached(path: Path) -> VectorIndex | None:
    """The index in the file, from this process's copy when the file has not changed since it was read."""
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    held = _CACHE.get(path)
    if held is not None and held[0] == mtime:
        return held[1]
    try:
        index = VectorIndex.load(path)
    except Exception as error:  # noqa: BLE001  (a corrupt or foreign file is a cache miss: rebuild)
        logger.warning("dedup: index %s unreadable (%s); rebuilding", path, error)
        return None
    _CACHE[path] = (mtime, index)
    return index


def _save(index: VectorIndex, path: Path) -> None:
    index.save(path)  # temp file + rename: readers see the old file or the new one, never half of one
    _CACHE[path] = (path.stat().st_mtime_ns, index)


def _rows_above(key: str, mark: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, vectors) of the embedding rows with id > mark, in chunks (bounded memory on a rebuild)."""
    rows = TrajectoryEmbedding.objects.filter(embedder=key).order_by("id").values_list("id", "vector")
    while True:
        chunk = list(rows.filter(id__gt=mark)[:10_000])
        if not chunk:
            return
        yield np.array([i for i, _ in chunk], dtype=np.int64), np.stack([_vector(v) for _, v in chunk])
        mark = chunk[-1][0]


def index_rebuild(*, embedder: Embedder | None = None) -> VectorIndex:
    """Build the cache from every embedding row of the embedder, and save it."""
    embedder = embedder or dedup_embedder()
    with _writer():
        return _rebuild(embedder)


def _rebuild(embedder: Embedder) -> VectorIndex:
    parts = list(_rows_above(embedder_key(embedder), -1))
    ids = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, dtype=np.int64)
    vectors = np.concatenate([p[1] for p in parts]) if parts else np.empty((0, embedder.dim), dtype=np.float32)
    index = VectorIndex(embedder.dim, recall_floor=embedder.threshold)
    index.rebuild(ids, vectors)
    _save(index, index_path(embedder))
    return index


def index_refresh(*, embedder: Embedder | None = None) -> VectorIndex:
    """The saved index brought up to date: rows above its high-water mark added, then saved.

    Rebuilds instead when the file is missing or unreadable, is of another dimension, or claims rows the
    database never had (a mark above the largest id: the database was replaced under it).
    """
    embedder = embedder or dedup_embedder()
    with _writer():
        return _refresh(embedder)


def _refresh(embedder: Embedder) -> VectorIndex:
    path, key = index_path(embedder), embedder_key(embedder)
    index = _cached(path)
    newest = TrajectoryEmbedding.objects.filter(embedder=key).order_by("-id").values_list("id", flat=True).first()
    if index is None or index.dim != embedder.dim or index.high_water_mark > (newest or -1):
        return _rebuild(embedder)
    added = 0
    for ids, vectors in _rows_above(key, index.high_water_mark):
        index.add(ids, vectors)
        added += len(ids)
    if added:
        _save(index, path)
    return index


@contextmanager
def _writer() -> Iterator[None]:
    """One dedup writer across processes (Postgres advisory lock, held to the transaction's end) and threads."""
    with _THREAD_LOCK, transaction.atomic():
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        yield


# --- placing runs ------------------------------------------------------------------------------------------


def trajectory_dedup(
    *, trajectory_ids: Iterable[int], embedder: Embedder | str | None = None, across_tasks: bool = False
) -> DedupReport:
    """Hash, embed and place these runs (those finished; others are skipped). Idempotent; may be redelivered."""
    embedder = _resolve(embedder)
    ids = sorted({int(i) for i in trajectory_ids})
    trajectories = _finished(ids)
    report = DedupReport(skipped=len(ids) - len(trajectories), trajectory_ids=[t.pk for t in trajectories])
    if not trajectories:
        return report
    signed = _signed(trajectories)
    report.embedded = _embed(signed, embedder)  # outside the writer lock: embedding is the slow part
    with _writer():
        index = _refresh(embedder)
        _place_all(signed, embedder, index, across_tasks, report)
    return report


def dedup_pending(
    *, limit: int = PENDING_BATCH, embedder: Embedder | str | None = None, across_tasks: bool = False
) -> DedupReport:
    """Dedup the oldest finished runs that have no embedding from the embedder yet (the beat's backlog)."""
    embedder = _resolve(embedder)
    ids = list(pending_trajectories(embedder=embedder).values_list("id", flat=True)[:limit])
    if not ids:
        return DedupReport()
    return trajectory_dedup(trajectory_ids=ids, embedder=embedder, across_tasks=across_tasks)


def pending_trajectories(*, embedder: Embedder):
    """Finished runs without an embedding row of this embedder, oldest first."""
    embedded = TrajectoryEmbedding.objects.filter(embedder=embedder_key(embedder)).values("trajectory_id")
    return (Trajectory.objects.exclude(status=Trajectory.Status.RUNNING).exclude(id__in=embedded)
            .order_by("id"))


class _Placer:
    """What the store knows of embedded runs, as `assign` wants it: `Member`s keyed by embedding id.

    Runs of the current batch not yet placed are hidden, so a run is compared only with runs placed
    before it and the earliest run of a new cluster becomes its canonical.
    """

    def __init__(self, key: str, unplaced: set[int]):
        self.key = key
        self.unplaced = unplaced

    def lookup(self, embedding_ids: list[int]) -> dict[int, Member]:
        wanted = [i for i in embedding_ids if i not in self.unplaced]
        rows = list(TrajectoryEmbedding.objects.filter(pk__in=wanted, embedder=self.key).values_list(
            "pk", "trajectory_id", "trajectory__task_key", "trajectory__cluster_id", "trajectory__cluster__canonical_id"))
        canonicals = self.embedding_ids([c for *_, c in rows if c is not None])
        return {
            pk: Member(pk, task_key, f"c{cluster}" if cluster else f"solo{trajectory}",
                       canonicals.get(canonical, pk) if cluster and canonical else pk)
            for pk, trajectory, task_key, cluster, canonical in rows
        }

    def embedding_ids(self, trajectory_ids: list[int]) -> dict[int, int]:
        """trajectory id -> its embedding id under this embedder."""
        if not trajectory_ids:
            return {}
        return dict(TrajectoryEmbedding.objects.filter(trajectory_id__in=trajectory_ids, embedder=self.key)
                    .values_list("trajectory_id", "pk"))

    def exact_twin(self, trajectory: Trajectory, embedding_id: int) -> Member | None:
        """The earliest placed run with the same exact hash (the hash includes the task)."""
        twins = (TrajectoryEmbedding.objects.filter(embedder=self.key, trajectory__content_hash=trajectory.content_hash)
                 .exclude(pk__in=self.unplaced | {embedding_id}).order_by("trajectory_id").values_list("pk", flat=True))
        first = twins.first()
        return self.lookup([first])[first] if first is not None else None


def _place_all(signed: list[_Signed], embedder: Embedder, index: VectorIndex, across_tasks: bool,
               report: DedupReport) -> None:
    key = embedder_key(embedder)
    rows = {t: (pk, _vector(v)) for pk, t, v in TrajectoryEmbedding.objects.filter(
        trajectory_id__in=[s.trajectory.pk for s in signed], embedder=key).values_list("pk", "trajectory_id", "vector")}
    placer = _Placer(key, {rows[s.trajectory.pk][0] for s in signed if s.trajectory.cluster_id is None})
    for item in signed:
        trajectory = item.trajectory
        embedding_id, vector = rows[trajectory.pk]
        report.placed += 1
        if trajectory.cluster_id is not None:  # placed before (or by a curator): keep it
            continue
        dedup_item = DedupItem(embedding_id, trajectory.task_key, trajectory.content_hash, vector)
        result = assign(dedup_item, index=index, lookup=placer.lookup, threshold=embedder.threshold,
                        across_tasks=across_tasks, exact_match=placer.exact_twin(trajectory, embedding_id))
        placer.unplaced.discard(embedding_id)
        if result.is_duplicate:
            _mark(trajectory, result)
            report.duplicates += 1


def _mark(trajectory: Trajectory, result: Assignment) -> None:
    canonical_id = TrajectoryEmbedding.objects.values_list("trajectory_id", flat=True).get(pk=result.canonical_id)
    method = DedupCluster.Method.EXACT if result.match == "exact" else DedupCluster.Method.NEAR
    cluster = _cluster_of(result, canonical_id, method)
    # The cluster's own canonical wins: it may have no vector under this embedder (a curator chose it).
    canonical_id = cluster.canonical_id or canonical_id
    if cluster.method == DedupCluster.Method.EXACT and method == DedupCluster.Method.NEAR:
        cluster.method = method
    Trajectory.objects.filter(pk=trajectory.pk).update(
        cluster=cluster, canonical_id=canonical_id, is_duplicate=True, similarity=result.similarity)
    trajectory.cluster_id = cluster.pk
    cluster.size = Trajectory.objects.filter(cluster=cluster).count()
    cluster.save(update_fields=["method", "size", "updated_at"])


def _cluster_of(result: Assignment, canonical_id: int, method: str) -> DedupCluster:
    """The cluster the assignment names; a lone canonical gets a new one (automatic, `method`)."""
    if result.cluster_key.startswith("c"):
        return DedupCluster.objects.get(pk=int(result.cluster_key[1:]))
    canonical = Trajectory.objects.get(pk=canonical_id)
    cluster = DedupCluster.objects.create(task_key=canonical.task_key, method=method, canonical=canonical, size=1)
    Trajectory.objects.filter(pk=canonical_id).update(cluster=cluster, canonical=None, is_duplicate=False, similarity=1.0)
    return cluster


# --- batch rebuild -----------------------------------------------------------------------------------------


def dedup_rebuild(*, embedder: Embedder | str | None = None, across_tasks: bool = False, batch: int = 500,
                  progress: Any = None) -> dict[str, Any]:
    """Re-embed every finished run whose signature or embedder changed, rebuild the index from the rows, and
    re-cluster every automatic cluster in one batch. Curated (manual) clusters and their runs are left as
    they are. `progress(n)` is called as runs are embedded (a progress bar)."""
    embedder = _resolve(embedder)
    embedded = 0
    finished = Trajectory.objects.exclude(status=Trajectory.Status.RUNNING).order_by("id").values_list("id", flat=True)
    after = 0
    while ids := list(finished.filter(id__gt=after)[:batch]):
        embedded += _embed(_signed(_finished(ids)), embedder)
        after = ids[-1]
        if progress:
            progress(len(ids))
    with _writer():
        index = _rebuild(embedder)
        clusters = _recluster(embedder, across_tasks)
    return {"embedder": embedder_key(embedder), "embedded": embedded, "indexed": len(index),
            "index_kind": index.kind, **clusters}


def _recluster(embedder: Embedder, across_tasks: bool) -> dict[str, int]:
    key = embedder_key(embedder)
    rows = (TrajectoryEmbedding.objects.filter(embedder=key).exclude(trajectory__cluster__method=DedupCluster.Method.MANUAL)
            .values_list("trajectory_id", "trajectory__task_key", "trajectory__content_hash", "vector"))
    items = [DedupItem(t, task, h, _vector(v)) for t, task, h, v in rows]
    assignments = cluster_items(items, threshold=embedder.threshold, across_tasks=across_tasks)
    automatic = DedupCluster.objects.exclude(method=DedupCluster.Method.MANUAL)
    reuse = dict(automatic.values_list("canonical_id", "pk"))
    groups: dict[int, list[Assignment]] = defaultdict(list)
    for result in assignments:
        groups[result.canonical_id].append(result)
    task_of = {item.id: item.task_key for item in items}
    kept: set[int] = set()
    Trajectory.objects.filter(id__in=[i.id for i in items]).update(
        cluster=None, canonical=None, is_duplicate=False, similarity=None)
    for canonical_id, members in groups.items():
        if len(members) > 1:
            kept.add(_write_cluster(canonical_id, members, task_of[canonical_id], reuse.get(canonical_id)))
    automatic.exclude(pk__in=kept).delete()
    return {"clusters": len(kept), "duplicates": sum(len(m) - 1 for m in groups.values() if len(m) > 1)}


def _write_cluster(canonical_id: int, members: list[Assignment], task_key: str, existing: int | None) -> int:
    method = DedupCluster.Method.NEAR if any(m.match == "near" for m in members) else DedupCluster.Method.EXACT
    if existing is None:
        cluster = DedupCluster.objects.create(task_key=task_key, method=method, canonical_id=canonical_id, size=len(members))
    else:
        DedupCluster.objects.filter(pk=existing).update(task_key=task_key, method=method, size=len(members))
        cluster = DedupCluster(pk=existing)
    Trajectory.objects.filter(pk=canonical_id).update(cluster=cluster, similarity=1.0)
    for result in members:
        if result.is_duplicate:
            Trajectory.objects.filter(pk=result.id).update(
                cluster=cluster, canonical_id=canonical_id, is_duplicate=True, similarity=result.similarity)
    return cluster.pk


# --- similar runs ------------------------------------------------------------------------------------------


def similar_runs(
    *, trajectory_id: int, k: int = 10, same_task: bool = True, limit: int | None = None,
    embedder: Embedder | str | None = None,
) -> list[tuple[Trajectory, float]]:
    """The runs nearest to one run by signature embedding, best first, as (trajectory, cosine) pairs.

    Read-only: a run not embedded yet is embedded on the fly (not stored). Searches the process's copy of
    the index (kept in step with the file), widening while too few hits are of the run's task.
    `limit` is an alias of `k` (the search hook's name for it).
    """
    k = min(limit or k, MAX_SIMILAR_K)
    embedder = _resolve(embedder)
    trajectory = Trajectory.objects.filter(pk=trajectory_id).only("id", "task_key").first()
    if trajectory is None:
        raise NotFound(f"trajectory {trajectory_id} does not exist", field="trajectory")
    index = _reader_index(embedder)
    query = _query_vector(trajectory_id, embedder)
    width = k + 1
    while True:
        with _THREAD_LOCK:  # a writer thread may be adding to this same in-process copy
            scores, ids = index.search(query, width)  # tuned for the plain top-10
        hits = _hits(scores[0], ids[0], embedder, trajectory, same_task)
        if len(hits) >= k or width >= len(index) or width >= MAX_SIMILAR_K:
            return hits[:k]
        width = min(width * 4, MAX_SIMILAR_K)


def _reader_index(embedder: Embedder) -> VectorIndex:
    with _THREAD_LOCK:
        index = _cached(index_path(embedder))
    return index if index is not None else index_refresh(embedder=embedder)


def _query_vector(trajectory_id: int, embedder: Embedder) -> np.ndarray:
    row = TrajectoryEmbedding.objects.filter(trajectory_id=trajectory_id, embedder=embedder_key(embedder)).values_list(
        "vector", flat=True).first()
    if row is not None:
        return _vector(row)
    (item,) = _signed(list(Trajectory.objects.filter(pk=trajectory_id)))
    return embedder.embed([item.text])[0]


def _hits(scores: np.ndarray, ids: np.ndarray, embedder: Embedder, trajectory: Trajectory,
          same_task: bool) -> list[tuple[Trajectory, float]]:
    found = [(int(i), float(s)) for i, s in zip(ids, scores, strict=True) if i >= 0]
    runs = dict(TrajectoryEmbedding.objects.filter(pk__in=[i for i, _ in found], embedder=embedder_key(embedder))
                .values_list("pk", "trajectory_id"))
    rows = Trajectory.objects.in_bulk({runs[i] for i, _ in found if i in runs})
    hits, seen = [], {trajectory.pk}
    for embedding_id, score in found:
        run = rows.get(runs.get(embedding_id, -1))
        if run is None or run.pk in seen or (same_task and run.task_key != trajectory.task_key):
            continue
        seen.add(run.pk)
        hits.append((run, score))
    return hits


# --- clusters: reading and curating ------------------------------------------------------------------------


def cluster_get(*, cluster_id: int) -> DedupCluster:
    try:
        return DedupCluster.objects.select_related("canonical").get(pk=cluster_id)
    except DedupCluster.DoesNotExist:
        raise NotFound(f"cluster {cluster_id} does not exist", field="cluster") from None


def cluster_list(*, limit: int = 100):
    """Clusters with more than one run, largest first."""
    return (DedupCluster.objects.filter(size__gt=1).select_related("canonical").order_by("-size", "-id")[:limit])


def cluster_members(*, cluster: DedupCluster) -> list[tuple[Trajectory, list[str]]]:
    """The cluster's runs (canonical first, then by id), each with its normalised actions."""
    members = list(Trajectory.objects.filter(cluster=cluster).order_by("is_duplicate", "id"))
    return [(t, action_sequence(record)) for t, record in _action_records(members)]


_TRACKED = ("cluster_id", "canonical_id", "is_duplicate", "similarity")


def _state(trajectory: Trajectory) -> dict[str, Any]:
    return {name: getattr(trajectory, name) for name in _TRACKED}


def _locked_members(cluster_ids: Sequence[int]) -> list[Trajectory]:
    return list(Trajectory.objects.select_for_update().filter(cluster_id__in=cluster_ids).order_by("id"))


def cluster_split(*, cluster_id: int, trajectory_id: int, actor: Any = None, reason: str = "") -> DedupCluster:
    """Move one run out of its cluster into a cluster of its own: not a duplicate of anything.

    Both clusters become `manual`, so automatic dedup never undoes the curator. If the run was the
    canonical, the earliest remaining run becomes the canonical. Returns the run's new cluster.
    """
    with transaction.atomic():
        cluster = DedupCluster.objects.select_for_update().filter(pk=cluster_id).first()
        if cluster is None:
            raise NotFound(f"cluster {cluster_id} does not exist", field="cluster")
        members = {t.pk: t for t in _locked_members([cluster_id])}
        if trajectory_id not in members:
            raise ValidationError(f"trajectory: run {trajectory_id} is not in cluster {cluster_id}", field="trajectory")
        alone = DedupCluster.objects.create(task_key=members[trajectory_id].task_key, method=DedupCluster.Method.MANUAL,
                                            canonical_id=trajectory_id, size=1)
        rest = [t for pk, t in members.items() if pk != trajectory_id]
        plans = {trajectory_id: dict(cluster_id=alone.pk, canonical_id=None, is_duplicate=False, similarity=None)}
        plans.update(_canonical_plan(rest, cluster.pk, _keep_canonical(cluster, rest)))
        _apply_plans(members, plans, action="split", actor=actor, reason=reason)
        _finish_cluster(cluster)
    return alone


def cluster_merge(*, cluster_id: int, other_cluster_id: int, canonical_id: int | None = None, actor: Any = None,
                  reason: str = "") -> DedupCluster:
    """Join two clusters into one with `canonical_id` (a run of either; default: the first's canonical).

    The merged cluster is `manual`; the emptied one is deleted (its runs are not). Similarities are
    recomputed to the chosen canonical from the stored embeddings.
    """
    if cluster_id == other_cluster_id:
        raise ValidationError("other: a cluster cannot be merged with itself", field="other")
    with transaction.atomic():
        clusters = {c.pk: c for c in DedupCluster.objects.select_for_update().filter(pk__in=[cluster_id, other_cluster_id])}
        for pk in (cluster_id, other_cluster_id):
            if pk not in clusters:
                raise NotFound(f"cluster {pk} does not exist", field="cluster")
        members = {t.pk: t for t in _locked_members([cluster_id, other_cluster_id])}
        canonical_id = canonical_id or clusters[cluster_id].canonical_id or min(members)
        if canonical_id not in members:
            raise ValidationError(f"canonical: run {canonical_id} is in neither cluster", field="canonical")
        target_id = members[canonical_id].cluster_id or cluster_id
        target = clusters[target_id]
        other = clusters[other_cluster_id if target_id == cluster_id else cluster_id]
        plans = _canonical_plan(list(members.values()), target.pk, canonical_id)
        _apply_plans(members, plans, action="merge", actor=actor, reason=reason)
        other.delete()
        _finish_cluster(target)
    return target


def _keep_canonical(cluster: DedupCluster, rest: list[Trajectory]) -> int | None:
    ids = {t.pk for t in rest}
    if cluster.canonical_id in ids:
        return cluster.canonical_id
    return min(ids) if ids else None


def _canonical_plan(members: list[Trajectory], cluster_id: int, canonical_id: int | None) -> dict[int, dict[str, Any]]:
    if canonical_id is None:
        return {}
    similarity = _similarities(canonical_id, [t.pk for t in members])
    return {
        t.pk: dict(cluster_id=cluster_id, canonical_id=None if t.pk == canonical_id else canonical_id,
                   is_duplicate=t.pk != canonical_id, similarity=1.0 if t.pk == canonical_id else similarity.get(t.pk))
        for t in members
    }


def _similarities(canonical_id: int, trajectory_ids: list[int]) -> dict[int, float]:
    """Cosine of each run to the canonical, from stored vectors of the default embedder (when both have one)."""
    key = embedder_key(dedup_embedder())
    rows = dict(TrajectoryEmbedding.objects.filter(trajectory_id__in=[*trajectory_ids, canonical_id], embedder=key)
                .values_list("trajectory_id", "vector"))
    if canonical_id not in rows:
        return {}
    anchor = _vector(rows[canonical_id])
    return {pk: round(float(np.dot(anchor, _vector(raw))), 6) for pk, raw in rows.items()}


def _apply_plans(members: Mapping[int, Trajectory], plans: Mapping[int, dict[str, Any]], *, action: str, actor: Any,
                 reason: str) -> None:
    """Write each run's new dedup state; one CurationEvent per run whose state changed."""
    events = []
    for pk, after in plans.items():
        trajectory = members[pk]
        before = _state(trajectory)
        if before == after:
            continue
        Trajectory.objects.filter(pk=pk).update(**after)
        events.append(CurationEvent(trajectory_id=pk, actor_id=getattr(actor, "pk", None), action=action,
                                    before=before, after=after, reason=reason))
    CurationEvent.objects.bulk_create(events)


def _finish_cluster(cluster: DedupCluster) -> None:
    canonical = Trajectory.objects.filter(cluster=cluster, is_duplicate=False).order_by("id").first()
    cluster.canonical = canonical
    cluster.method = DedupCluster.Method.MANUAL
    cluster.size = Trajectory.objects.filter(cluster=cluster).count()
    cluster.save(update_fields=["canonical", "method", "size", "updated_at"])
