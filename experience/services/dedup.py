"""Dedup in the store: embed finished runs, keep the FAISS cache current, mark duplicates, curate clusters.

The algorithms live in experience.dedup (no ORM); this module reads rows, calls them and writes back.

- `trajectory_dedup(trajectory_ids=)`: per finished run, the exact hash (`content_hash`), the signature's
  embedding (a `TrajectoryEmbedding` row per embedder), then its place: the cluster of an exact duplicate of
  the same task, else of its nearest neighbour at or above the embedder's calibrated threshold (same task
  unless `across_tasks`), else none. A run with no actions has no exact hash (empty) and is never placed,
  nor found as anyone's neighbour. Idempotent: a run already in a cluster keeps it, an unchanged
  signature is not embedded again.
- Canonicals and duplicate marks are derived from the members' outcomes (experience.dedup.canonical):
  each outcome group of a cluster keeps a representative, the others are duplicates of it, so a run is
  only ever a duplicate of a run with the same outcome; a cluster with several groups is `mixed_outcomes`.
  Re-derived whenever a member joins, whenever members' outcomes or curation change
  (`dedup_outcomes_changed`), and for every cluster derived under an older rule (`clusters_rederive_stale`,
  from the dedup beat). Nothing is deleted.
- The FAISS index (experience.dedup.index.VectorIndex) is a cache of the embedding rows, keyed by
  `TrajectoryEmbedding.id`, one file per embedder and version under TROVE_INDEX_DIR. Its high-water mark is
  the largest embedding id it holds: `index_refresh` adds the rows above it. Embedding ids, not trajectory
  ids, because runs finish out of order: a rollout opened first may finish (and be embedded) last.
- One writer at a time: placing runs and saving the index happen under a Postgres advisory lock (a thread
  lock on SQLite), so two workers cannot each start a cluster for two copies of one run, or save over each
  other's index. Readers (`similar_runs`) use an in-process copy, reloaded when the file changes; the file
  is replaced atomically (temp file + rename, in VectorIndex.save).
- `dedup_rebuild`: re-embed, rebuild the index from the rows, and re-cluster every automatic cluster in one
  batch (single linkage, canonicals by the rule). Clusters a curator touched (`method=manual`) keep their
  runs and their canonical; their marks are re-derived.
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
from django.db.models import F, Q

from experience.dedup.canonical import CANONICAL_RULE_VERSION, Candidate, Derivation, derive, outcome_of
from experience.dedup.cluster import Assignment, DedupItem, Member, assign, cluster_items
from experience.dedup.embed import DEFAULT_EMBEDDER, Embedder, get_embedder
from experience.dedup.index import VectorIndex
from experience.dedup.signature import ACTION_KINDS, NO_SIGNATURE, action_sequence, exact_hash, signature_text
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
    rederived: int = 0  # clusters re-derived under the current canonical rule (the beat's sweep)
    trajectory_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        names = ("embedded", "placed", "duplicates", "skipped", "rederived")
        return {name: getattr(self, name) for name in names}


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
    report = trajectory_dedup(trajectory_ids=ids, embedder=embedder, across_tasks=across_tasks) if ids else DedupReport()
    report.rederived = clusters_rederive_stale(limit=limit, embedder=embedder)
    return report


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
        # A run with no actions is nobody's neighbour: its signature is its task head and nothing else.
        embedded = TrajectoryEmbedding.objects.filter(pk__in=wanted, embedder=self.key).exclude(
            trajectory__content_hash=NO_SIGNATURE)
        rows = list(embedded.values_list(
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
    joined: list[int] = []
    touched: set[int] = set()
    for item in signed:
        trajectory = item.trajectory
        embedding_id, vector = rows[trajectory.pk]
        report.placed += 1
        if trajectory.cluster_id is not None:  # placed before (or by a curator): keep it
            continue
        if trajectory.content_hash == NO_SIGNATURE:  # no actions: nothing to be a duplicate by
            continue
        dedup_item = DedupItem(embedding_id, trajectory.task_key, trajectory.content_hash, vector)
        result = assign(dedup_item, index=index, lookup=placer.lookup, threshold=embedder.threshold,
                        across_tasks=across_tasks, exact_match=placer.exact_twin(trajectory, embedding_id))
        placer.unplaced.discard(embedding_id)
        if result.is_duplicate:
            touched.add(_join(trajectory, result))
            joined.append(trajectory.pk)
    # Once per cluster, after the batch: placing only needs membership (and each cluster's canonical,
    # set when it was made), so a batch of n runs joining one big cluster re-derives it once, not n times.
    for cluster in DedupCluster.objects.select_for_update().filter(pk__in=touched).order_by("pk"):
        _derive_cluster(cluster, key=key)
    report.duplicates = Trajectory.objects.filter(pk__in=joined, is_duplicate=True).count()


def _join(trajectory: Trajectory, result: Assignment) -> int:
    """Put the run in the cluster the assignment names (a new one for a lone canonical); returns its id.
    Its canonical and marks are derived by the caller (`_derive_cluster`)."""
    canonical_id = TrajectoryEmbedding.objects.values_list("trajectory_id", flat=True).get(pk=result.canonical_id)
    method = DedupCluster.Method.EXACT if result.match == "exact" else DedupCluster.Method.NEAR
    cluster = _cluster_of(result, canonical_id, method)
    if cluster.method == DedupCluster.Method.EXACT and method == DedupCluster.Method.NEAR:
        DedupCluster.objects.filter(pk=cluster.pk).update(method=method)
    Trajectory.objects.filter(pk=trajectory.pk).update(cluster=cluster)
    trajectory.cluster_id = cluster.pk
    return cluster.pk


def _cluster_of(result: Assignment, canonical_id: int, method: str) -> DedupCluster:
    """The cluster the assignment names; a lone canonical gets a new one (automatic, `method`)."""
    if result.cluster_key.startswith("c"):
        return DedupCluster.objects.get(pk=int(result.cluster_key[1:]))
    canonical = Trajectory.objects.get(pk=canonical_id)
    cluster = DedupCluster.objects.create(task_key=canonical.task_key, method=method, canonical=canonical, size=1,
                                          canonical_rule=CANONICAL_RULE_VERSION)
    Trajectory.objects.filter(pk=canonical_id).update(cluster=cluster, canonical=None, is_duplicate=False, similarity=1.0)
    return cluster


# --- canonicals and duplicate marks -------------------------------------------------------------------

_TRACKED = ("cluster_id", "canonical_id", "is_duplicate", "similarity")
_OUTCOME = ("success", "reward", "curation_status")


def _members_of(trajectory_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Each run's dedup state and what the canonical rule reads of it, by id."""
    rows = Trajectory.objects.filter(pk__in=list(trajectory_ids)).values_list("pk", *_TRACKED, *_OUTCOME)
    return {pk: dict(zip((*_TRACKED, *_OUTCOME), values, strict=True)) for pk, *values in rows}


def _vectors_key(embedder: Embedder | str | None) -> str:
    """Whose stored vectors give similarities: the embedder's, else the configured one's. Named, not
    loaded: re-deriving after a curator's edit must not load a model in a web request."""
    if embedder is not None and not isinstance(embedder, str):
        return embedder_key(embedder)
    return embedder_key(get_embedder(embedder or getattr(settings, "TROVE_DEDUP_EMBEDDER", "") or DEFAULT_EMBEDDER))


def _candidate(pk: int, row: Mapping[str, Any]) -> Candidate:
    return Candidate(pk, outcome_of(success=row["success"], reward=row["reward"]), row["curation_status"])


def _vectors(trajectory_ids: Iterable[int], key: str) -> dict[int, np.ndarray]:
    rows = TrajectoryEmbedding.objects.filter(trajectory_id__in=list(trajectory_ids), embedder=key)
    return {pk: _vector(raw) for pk, raw in rows.values_list("trajectory_id", "vector")}


def _marks(cluster_id: int, derivation: Derivation, member_ids: Iterable[int],
           vectors: Mapping[int, np.ndarray]) -> dict[int, dict[str, Any]]:
    """Each member's dedup state under the derivation. `similarity` is the cosine to the run it duplicates
    (a representative: to the cluster's canonical), from the stored vectors (None without both)."""
    plans = {}
    for pk in member_ids:
        anchor = derivation.duplicate_of.get(pk)
        to = anchor if anchor is not None else derivation.canonical_id
        plans[pk] = dict(cluster_id=cluster_id, canonical_id=anchor, is_duplicate=anchor is not None,
                         similarity=_cosine(vectors, pk, to))
    return plans


def _cosine(vectors: Mapping[int, np.ndarray], left: int, right: int) -> float | None:
    if left == right:
        return 1.0
    if left not in vectors or right not in vectors:
        return None
    return round(float(np.dot(vectors[left], vectors[right])), 6)


def _derived(cluster: DedupCluster, members: Mapping[int, Mapping[str, Any]], key: str,
             pinned: int | None) -> tuple[Derivation, dict[int, dict[str, Any]]]:
    derivation = derive([_candidate(pk, row) for pk, row in members.items()], pinned=pinned)
    return derivation, _marks(cluster.pk, derivation, members, _vectors(members, key))


def _write_marks(members: Mapping[int, Mapping[str, Any]], plans: Mapping[int, dict[str, Any]]) -> int:
    """Write the states that changed (no CurationEvent: automatic dedup); returns how many."""
    changed = 0
    for pk, after in plans.items():
        if {name: members[pk][name] for name in _TRACKED} != after:
            Trajectory.objects.filter(pk=pk).update(**after)
            changed += 1
    return changed


def _settle(cluster: DedupCluster, derivation: Derivation, size: int) -> None:
    cluster.canonical_id = derivation.canonical_id
    cluster.mixed_outcomes = derivation.mixed_outcomes
    cluster.canonical_rule = CANONICAL_RULE_VERSION
    cluster.size = size
    cluster.save(update_fields=["canonical", "mixed_outcomes", "canonical_rule", "method", "task_key", "size",
                                "updated_at"])


def _pinned(cluster: DedupCluster) -> int | None:
    """A curator's canonical stands (manual clusters); an automatic cluster's follows the rule."""
    return cluster.canonical_id if cluster.method == DedupCluster.Method.MANUAL else None


def _derive_cluster(cluster: DedupCluster, *, key: str) -> None:
    """Re-derive a cluster's canonical and its members' marks from their outcomes. Caller holds the
    cluster's row lock (or the writer lock); an emptied automatic cluster is deleted."""
    members = _members_of(Trajectory.objects.filter(cluster=cluster).values_list("pk", flat=True))
    if not members:
        cluster.delete()
        return
    derivation, plans = _derived(cluster, members, key, _pinned(cluster))
    _write_marks(members, plans)
    _settle(cluster, derivation, len(members))


def _drop_runs_without_actions(cluster: DedupCluster, key: str) -> None:
    """Members (of an automatic cluster) with no actions leave it: re-hashed first, since their hashes
    may be from before a run with no actions had none. A cluster left with one run is dissolved."""
    if cluster.method == DedupCluster.Method.MANUAL:
        return
    members = _finished(Trajectory.objects.filter(cluster=cluster).values_list("pk", flat=True))
    signed = _signed(members)
    _write_hashes([item for item in signed if item.trajectory.content_hash != item.content_hash])
    empty = [item.trajectory.pk for item in signed if item.content_hash == NO_SIGNATURE]
    if len(members) - len(empty) < 2:
        empty = [t.pk for t in members]
    Trajectory.objects.filter(pk__in=empty).update(cluster=None, canonical=None, is_duplicate=False, similarity=None)


def clusters_rederive(*, cluster_ids: Iterable[int], embedder: Embedder | str | None = None) -> int:
    """Re-derive these clusters' canonicals and duplicate marks (missing ids are ignored); returns how many
    were re-derived. Takes the dedup writer lock: call it outside a transaction that holds run rows."""
    key = _vectors_key(embedder)
    ids = sorted({int(i) for i in cluster_ids})
    with _writer():
        clusters = list(DedupCluster.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        for cluster in clusters:
            if cluster.canonical_rule != CANONICAL_RULE_VERSION:
                _drop_runs_without_actions(cluster, key)
            _derive_cluster(cluster, key=key)
    return len(clusters)


def clusters_rederive_stale(*, limit: int = PENDING_BATCH, embedder: Embedder | str | None = None) -> int:
    """Re-derive up to `limit` clusters derived under an older canonical rule (or none), oldest first: after
    `CANONICAL_RULE_VERSION` changes, the dedup beat works through the store a batch at a time."""
    stale = DedupCluster.objects.exclude(canonical_rule=CANONICAL_RULE_VERSION).order_by("pk")
    ids = list(stale.values_list("pk", flat=True)[:limit])
    return clusters_rederive(cluster_ids=ids, embedder=embedder) if ids else 0


def dedup_outcomes_changed(*, trajectory_ids: Iterable[int]) -> None:
    """Tell dedup that these runs' reward, success, labels or curation status changed: their clusters'
    canonicals and duplicate marks are re-derived once the caller's transaction commits (at once when
    there is none), so a run that turned out to succeed stops being a duplicate of a failure.

    After the commit, not inside it: the caller holds the runs' row locks, and the dedup writer takes its
    lock before it touches runs; taking it the other way round could deadlock with a placing worker.
    """
    ids = sorted({int(i) for i in trajectory_ids})
    if ids:
        transaction.on_commit(lambda: _rederive_clusters_of(ids))


def _rederive_clusters_of(trajectory_ids: list[int]) -> None:
    clusters = Trajectory.objects.filter(pk__in=trajectory_ids, cluster__isnull=False).values_list("cluster_id", flat=True)
    clusters_rederive(cluster_ids=set(clusters))


def same_outcome_duplicates() -> Q:
    """SQL: runs marked duplicate of a run with the same outcome (`canonical.outcome_of`: solved alike and
    the same reward), the only duplicates a dataset build leaves out (`distill.selection`). A mark left
    stale by an outcome change, or a curator's mark of a success as a failure's duplicate, does not count."""
    return Q(is_duplicate=True, canonical__isnull=False) & _same_solved() & _same_reward()


def _solved_states(prefix: str) -> tuple[Q, Q, Q]:
    success, reward = f"{prefix}success", f"{prefix}reward"
    won = Q(**{success: True}) | Q(**{f"{success}__isnull": True, f"{reward}__gt": 0})
    lost = Q(**{success: False}) | Q(**{f"{success}__isnull": True, f"{reward}__lte": 0})
    unknown = Q(**{f"{success}__isnull": True, f"{reward}__isnull": True})
    return won, lost, unknown


def _same_solved() -> Q:
    mine, theirs = _solved_states(""), _solved_states("canonical__")
    return (mine[0] & theirs[0]) | (mine[1] & theirs[1]) | (mine[2] & theirs[2])


def _same_reward() -> Q:
    return Q(reward=F("canonical__reward")) | Q(reward__isnull=True, canonical__reward__isnull=True)


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
    families = [members for members in groups.values() if len(members) > 1]
    Trajectory.objects.filter(id__in=[i.id for i in items]).update(
        cluster=None, canonical=None, is_duplicate=False, similarity=None)
    states = _members_of(result.id for members in families for result in members)
    vectors = {item.id: item.vector for item in items}
    task_of = {item.id: item.task_key for item in items}
    kept: set[int] = set()
    duplicates = 0
    for members in families:
        family = {result.id: states[result.id] for result in members}
        derivation = derive([_candidate(pk, row) for pk, row in family.items()])
        method = DedupCluster.Method.NEAR if any(m.match == "near" for m in members) else DedupCluster.Method.EXACT
        cluster = _family_cluster(reuse.get(derivation.canonical_id), task_of[derivation.canonical_id], method)
        _write_marks(family, _marks(cluster.pk, derivation, family, vectors))
        _settle(cluster, derivation, len(family))
        kept.add(cluster.pk)
        duplicates += derivation.duplicates
    automatic.exclude(pk__in=kept).delete()
    for cluster in DedupCluster.objects.filter(method=DedupCluster.Method.MANUAL):
        _derive_cluster(cluster, key=key)
    return {"clusters": len(kept), "duplicates": duplicates}


def _family_cluster(existing: int | None, task_key: str, method: str) -> DedupCluster:
    """The automatic cluster that had this canonical (reused, so its id survives a rebuild), or a new one."""
    if existing is not None:
        cluster = DedupCluster.objects.get(pk=existing)
        cluster.task_key, cluster.method = task_key, method
        return cluster
    return DedupCluster.objects.create(task_key=task_key, method=method)


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


OUTCOME_FILTERS = ("mixed", "same")


def cluster_list(*, limit: int = 100, outcomes: str | None = None):
    """Clusters with more than one run, largest first. `outcomes`: "mixed" (runs whose outcomes differ,
    grouped for browsing only) or "same"; None for all. Raises `ValidationError` on another value."""
    clusters = DedupCluster.objects.filter(size__gt=1)
    if outcomes:
        if outcomes not in OUTCOME_FILTERS:
            raise ValidationError(f"outcomes: {outcomes!r} is not one of {', '.join(OUTCOME_FILTERS)}", field="outcomes")
        clusters = clusters.filter(mixed_outcomes=outcomes == "mixed")
    return clusters.select_related("canonical").order_by("-size", "-id")[:limit]


def cluster_members(*, cluster: DedupCluster) -> list[tuple[Trajectory, list[str]]]:
    """The cluster's runs (the canonical first, then by id), each with its normalised actions."""
    members = sorted(Trajectory.objects.filter(cluster=cluster), key=lambda t: (t.pk != cluster.canonical_id, t.pk))
    return [(t, action_sequence(record)) for t, record in _action_records(members)]


def _state(trajectory: Trajectory) -> dict[str, Any]:
    return {name: getattr(trajectory, name) for name in _TRACKED}


def _locked_members(cluster_ids: Sequence[int]) -> list[Trajectory]:
    return list(Trajectory.objects.select_for_update().filter(cluster_id__in=cluster_ids).order_by("id"))


def cluster_split(*, cluster_id: int, trajectory_id: int, actor: Any = None, reason: str = "") -> DedupCluster:
    """Move one run out of its cluster into a cluster of its own: not a duplicate of anything.

    Both clusters become `manual`, so automatic dedup never undoes the curator. If the run was the
    canonical, the rule (experience.dedup.canonical) picks the new one among the rest. Returns the run's
    new cluster.
    """
    with transaction.atomic():
        cluster = DedupCluster.objects.select_for_update().filter(pk=cluster_id).first()
        if cluster is None:
            raise NotFound(f"cluster {cluster_id} does not exist", field="cluster")
        members = {t.pk: t for t in _locked_members([cluster_id])}
        if trajectory_id not in members:
            raise ValidationError(f"trajectory: run {trajectory_id} is not in cluster {cluster_id}", field="trajectory")
        alone = DedupCluster.objects.create(task_key=members[trajectory_id].task_key, method=DedupCluster.Method.MANUAL,
                                            canonical_id=trajectory_id, size=1, canonical_rule=CANONICAL_RULE_VERSION)
        rest = [t for pk, t in members.items() if pk != trajectory_id]
        plans = {trajectory_id: dict(cluster_id=alone.pk, canonical_id=None, is_duplicate=False, similarity=None)}
        kept = cluster.canonical_id if cluster.canonical_id != trajectory_id else None
        derivation = _curated_plan(rest, cluster.pk, kept, plans)
        _apply_plans(members, plans, action="split", actor=actor, reason=reason)
        _finish_cluster(cluster, derivation)
    return alone


def cluster_merge(*, cluster_id: int, other_cluster_id: int, canonical_id: int | None = None, actor: Any = None,
                  reason: str = "") -> DedupCluster:
    """Join two clusters into one with `canonical_id` (a run of either; default: the first's canonical).

    The merged cluster is `manual`; the emptied one is deleted (its runs are not). Runs whose outcome
    differs from the canonical's are not its duplicates: each outcome keeps a representative (the rule).
    Similarities are recomputed from the stored embeddings.
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
        plans: dict[int, dict[str, Any]] = {}
        derivation = _curated_plan(list(members.values()), target.pk, canonical_id, plans)
        _apply_plans(members, plans, action="merge", actor=actor, reason=reason)
        other.delete()
        _finish_cluster(target, derivation)
    return target


def _curated_plan(members: list[Trajectory], cluster_id: int, canonical_id: int | None,
                  plans: dict[int, dict[str, Any]]) -> Derivation | None:
    """Add the members' states under a curator's canonical (None: the rule's) to `plans`."""
    if not members:
        return None
    candidates = [_candidate(t.pk, {name: getattr(t, name) for name in _OUTCOME}) for t in members]
    derivation = derive(candidates, pinned=canonical_id)
    ids = [t.pk for t in members]
    plans.update(_marks(cluster_id, derivation, ids, _vectors(ids, _vectors_key(None))))
    return derivation


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


def _finish_cluster(cluster: DedupCluster, derivation: Derivation | None) -> None:
    cluster.method = DedupCluster.Method.MANUAL
    size = Trajectory.objects.filter(cluster=cluster).count()
    if derivation is None:
        cluster.canonical, cluster.size = None, size
        cluster.save(update_fields=["canonical", "method", "size", "updated_at"])
        return
    _settle(cluster, derivation, size)
