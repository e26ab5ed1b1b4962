"""Datasets: a spec stored as a `Dataset`, each build an immutable `DatasetVersion` with files on disk.

This is the database side of distillation; `experience.distill` is the algorithm. A build streams the
runs the spec's filters select out of the store (`dataset_source.source_runs`: ordered by (task key, id),
a batch at a time, never the whole store in memory) into `distill.build.distill_shard`, which writes one
JSONL.gz and one Parquet file per split, and `merge_shards` puts the manifest and files together under
`TROVE_DATASET_DIR/<dataset name>/<version>/`. The filters are `dataset_source`'s (task sets, models,
harnesses, sources, outcome, curation, dates, tags). Outside a transaction on Postgres the whole build
(store, records, rubric, labels, rows, files) runs in READERS forked reader processes side by side, each
building the shard of the tasks that fall to it (`_shards_aside`); the builder merges them. A value build
keeps each run's digest (`TrajectoryDigest`: its decisions, derived once from its steps) and a later one
reads the digest instead of the steps (`dataset_source.source_run_batches(digests=True)`).

Versions are immutable: a build writes into a scratch directory and renames it into place only when the
manifest is complete, and a ready version is never built again (a rebuild is a new version). A spec
that can give no rows is refused before a version is recorded (`check_spec_matches`), and a build that
still makes none fails with `EmptyDatasetError` naming the reason and leaves no files. Each build writes
the rubric labels of the runs it reads to `Label` rows (source `rubric`, version RUBRIC_VERSION), once
per run and rubric version.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import json
import logging
import multiprocessing
import os
import pickle
import queue
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from experience.distill.build import Shard, distill_shard, merge_shards, split_parts
from experience.distill.digest import DIGEST_VERSION, derive
from experience.distill.errors import EmptyDatasetError, SpecError
from experience.distill.rubric import RUBRIC_VERSION
from experience.distill.source import CURATION_REJECTED, UNUSABLE_STATUSES, SourceRun
from experience.distill.spec import DatasetSpec
from experience.distill.splits import EmptySplitError, check_splits, group_key_for, split_note
from experience.errors import Conflict, NotFound, TroveError, ValidationError
from experience.models import (
    CurationEvent,
    Dataset,
    DatasetVersion,
    Label,
    Step,
    Trajectory,
    TrajectoryDigest,
)
from experience.services.dataset_source import (
    Progress,
    StoredRun,
    digest_failures_write,
    digests_kept,
    digests_write,
    filters_clean,
    runs_matching,
    source_run_batches,
    stored_run_batches,
)
from experience.services.dedup import same_outcome_duplicates
from experience.services.preferences import pairwise_preferences

log = logging.getLogger("trove.datasets")

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
LABEL_SOURCE = "rubric"
MANIFEST_FILE = "manifest.json"
# Build in reader processes side by side when it can be (see `_shards_aside`).
READ_ASIDE = True
READERS = 2  # reader processes, each building the shard of a share of the tasks (see `_shards_aside`)
READER_PATIENCE_S = 5.0  # how long the builder waits on its readers before it checks they are alive
READER_GC_THRESHOLD = 50_000  # allocations between the reader's young collections (see `_collect_less`)
BUILD_GC_THRESHOLD = READER_GC_THRESHOLD  # the same, in the builder while a build runs (`_collector_relaxed`)
SHARD_PREFIX = "shard-"  # a reader's directory inside the build's scratch directory
SHARD_RESULT = "shard.pickle"  # in it, what the reader hands back (`_shard_received`)
PENDING_DIGESTS = 200  # runs one `digests_derive_pending` call derives at most (a beat tick's work)


# --- specs and filters -----------------------------------------------------------------------------------


def spec_for(
    *, kind: str, filters: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None
) -> DatasetSpec:
    """The DatasetSpec of a kind, its filters and its options. Raises `SpecError` / `ValidationError`."""
    options = dict(options or {})
    for reserved in ("kind", "filters"):
        if reserved in options:
            raise SpecError(f"options.{reserved}", f"give {reserved} on its own, not among the options")
    return DatasetSpec.from_dict({"kind": kind, **options, "filters": filters_clean(filters)})


def dataset_spec(dataset: Dataset) -> DatasetSpec:
    return spec_for(kind=dataset.kind, filters=dataset.filters, options=dataset.options)


def usable_runs(spec: DatasetSpec) -> QuerySet[Trajectory]:
    """The matching runs `distill.selection.exclusion_reason` would keep, as SQL (the precheck's count)."""
    runs = runs_matching(spec.filters).exclude(status__in=UNUSABLE_STATUSES)
    runs = runs.exclude(success__isnull=True, reward__isnull=True)
    if not spec.include_duplicates:
        runs = runs.exclude(same_outcome_duplicates())
    if not spec.include_rejected:
        runs = runs.exclude(curation_status=CURATION_REJECTED)
    return runs


def check_spec_matches(spec: DatasetSpec) -> None:
    """Raise `EmptyDatasetError` saying why, when the spec can give no rows: no run matches the filters,
    every match is left out (and for which reasons), or (pairwise) no task has both outcomes."""
    matching = runs_matching(spec.filters)
    total = matching.count()
    if total == 0:
        raise EmptyDatasetError(f"no stored run matches the filters {_describe_filters(spec.filters)}")
    if spec.filters.get("tags") and connection.vendor != "postgresql":
        return  # the tag filter runs in Python there: leave the exact answer to the build
    usable = usable_runs(spec)
    if not usable.exists():
        raise EmptyDatasetError(
            f"{total} runs match the filters but every one is left out ({_exclusions(matching, spec)})"
        )
    if spec.kind == "pairwise" and not spec.preferences and not _task_with_both_outcomes(usable):
        raise EmptyDatasetError(
            "no task has both a successful and a failed run among the usable runs, so there is no pair"
        )


def check_spec_splits(spec: DatasetSpec) -> None:
    """Raise `EmptySplitError` when a split with a share of the tasks (or repositories) would get none of
    the usable runs' tasks: it names the split, how the tasks fall, and a seed that would fill every split."""
    if spec.filters.get("tags") and connection.vendor != "postgresql":
        return  # the tag filter runs in Python there: the usable runs are not known here
    check_splits(_usable_groups(spec), spec)


def split_warnings(spec: DatasetSpec) -> list[str]:
    """What `check_spec_splits` would refuse with, as messages (none when every split gets tasks)."""
    try:
        check_spec_splits(spec)
    except EmptySplitError as warning:
        return [warning.message]
    return []


def _usable_groups(spec: DatasetSpec) -> set[str]:
    """The split groups of the runs a build would use (pairwise: only tasks with both outcomes)."""
    usable = usable_runs(spec)
    tasks: QuerySet[Trajectory, Mapping[str, object]] = usable.values("task_key")
    if spec.kind == "pairwise":
        tasks = _per_task_outcomes(usable).filter(won__gt=0, lost__gt=0).values("task_key")
    group_key = group_key_for(spec)
    return {group_key(task_key) for task_key in tasks.order_by().distinct().values_list("task_key", flat=True)}


def _describe_filters(filters: Mapping[str, Any]) -> str:
    return json.dumps(filters, sort_keys=True) if filters else "(none: the store holds no runs)"


def _exclusions(matching: QuerySet[Trajectory], spec: DatasetSpec) -> str:
    """Counts per reason, in the order `exclusion_reason` tries them (each run counted once)."""
    reasons: list[tuple[str, Q]] = []
    if not spec.include_duplicates:
        reasons.append(("duplicate", same_outcome_duplicates()))  # of a run with the same outcome
    if not spec.include_rejected:
        reasons.append(("rejected", Q(curation_status=CURATION_REJECTED)))
    reasons += [
        ("unfinished, cancelled or infra_error", Q(status__in=UNUSABLE_STATUSES)),
        ("no outcome recorded", Q(success__isnull=True, reward__isnull=True)),
    ]
    counts, seen = [], Q(pk__in=[])
    for name, condition in reasons:
        n = matching.filter(condition).exclude(seen).count()
        seen |= condition
        if n:
            counts.append(f"{name}: {n}")
    return ", ".join(counts)


def _task_with_both_outcomes(usable: QuerySet[Trajectory]) -> bool:
    return _per_task_outcomes(usable).filter(won__gt=0, lost__gt=0).exists()


def _per_task_outcomes(usable: QuerySet[Trajectory]) -> QuerySet:
    # Usable runs have a success flag or a reward, so these two cover each of them exactly once.
    won = Q(success=True) | Q(success__isnull=True, reward__gt=0)
    lost = Q(success=False) | Q(success__isnull=True, reward__lte=0)
    return usable.values("task_key").annotate(won=Count("id", filter=won), lost=Count("id", filter=lost))


# --- datasets and versions -------------------------------------------------------------------------------


def dataset_create(
    *,
    name: str,
    kind: str,
    filters: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    created_by: Any = None,
) -> Dataset:
    """A new dataset from a spec. Validates the name and the whole spec; a taken name is a `Conflict`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValidationError(
            "name: letters, digits, '.', '_' and '-' only (it names a directory), 1-200 characters",
            field="name",
        )
    spec = spec_for(kind=kind, filters=filters, options=options)
    options_only = {k: v for k, v in spec.to_dict().items() if k not in ("kind", "filters")}
    try:
        with transaction.atomic():
            return Dataset.objects.create(
                name=name, kind=spec.kind, filters=spec.filters, options=options_only, created_by=created_by
            )
    except IntegrityError:
        raise Conflict(f"name: a dataset named {name!r} already exists", field="name") from None


def dataset_version_request(
    *, dataset: Dataset, enqueue: Callable[[int], None] | None = None, force: bool = False
) -> DatasetVersion:
    """Record a new version to build (status `building`) and hand its id to `enqueue` after commit.

    Checks first that the spec can give rows (`EmptyDatasetError` otherwise, and nothing is recorded), and
    that no split meant to hold tasks would get none (`EmptySplitError`, unless `force`: then the warning
    is kept on the version, `forced_warnings`, and its manifest says so).
    Version numbers are handed out under a row lock on the dataset, so two requests never share one.
    """
    spec = dataset_spec(dataset)
    if spec.kind == "pairwise":  # the curators' choices as they stand now, frozen into this version
        spec = dataclasses.replace(spec, preferences=pairwise_preferences())
    check_spec_matches(spec)
    forced = split_warnings(spec) if force else []
    if not force:
        check_spec_splits(spec)
    with transaction.atomic():
        Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
        latest = dataset.versions.aggregate(n=Max("version"))["n"] or 0
        version = DatasetVersion.objects.create(dataset=dataset, version=latest + 1, spec=spec.to_dict(),
                                                forced_warnings=forced)
        if enqueue is not None:
            transaction.on_commit(lambda: enqueue(version.pk))
    return version


def version_dir(version: DatasetVersion) -> Path:
    return Path(settings.TROVE_DATASET_DIR) / version.dataset.name / str(version.version)


def dataset_version_build(*, version_id: int) -> DatasetVersion | None:
    """Build a `building` version: files, manifest, rubric labels. Idempotent and safe to redeliver.

    A version that is already ready or failed is returned as it is. A Postgres advisory lock (released
    if the builder dies with its connection) keeps a second builder of the same version out: it gets
    None. A builder that died mid-build left the version `building` and no lock, so a redelivery builds
    it again from scratch. A build error that is the data's or the spec's (e.g. nothing matched) marks
    the version failed with the error; a lost database connection is raised for the caller to retry.
    """
    version = _version(version_id)
    if version.status != DatasetVersion.Status.BUILDING:
        return version
    with _build_lock(version_id) as acquired:
        if not acquired:
            return None
        version.refresh_from_db()
        if version.status != DatasetVersion.Status.BUILDING:
            return version
        try:
            manifest = _build_files(version)
        except OperationalError:
            raise
        except TroveError as error:
            return _mark_failed(version, error.message)
        except Exception as error:  # noqa: BLE001 - recorded on the version, and logged with its traceback
            log.exception("dataset version %s failed to build", version_id)
            return _mark_failed(version, f"internal error: {type(error).__name__}: {error}")
        return _mark_ready(version, manifest)


def _version(version_id: int) -> DatasetVersion:
    try:
        return DatasetVersion.objects.select_related("dataset").get(pk=version_id)
    except DatasetVersion.DoesNotExist:
        raise NotFound(f"dataset version {version_id} does not exist") from None


_local_locks: dict[int, threading.Lock] = {}
_local_locks_guard = threading.Lock()
_LOCK_CLASS = 0x7D5E  # advisory lock namespace for dataset builds (the other key is the version id)


@contextmanager
def _build_lock(version_id: int) -> Iterator[bool]:
    """A session advisory lock on Postgres; a process-local lock elsewhere (the embedded default has one
    worker process)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_CLASS, version_id])
            acquired = bool(cursor.fetchone()[0])
        try:
            yield acquired
        finally:
            if acquired:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_CLASS, version_id])
        return
    with _local_locks_guard:
        lock = _local_locks.setdefault(version_id, threading.Lock())
    acquired = lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            lock.release()


def _build_files(version: DatasetVersion) -> dict[str, Any]:
    """Build into a scratch directory, then rename it into place: a version's directory is whole or absent."""
    spec = DatasetSpec.from_dict(version.spec)
    final = version_dir(version)
    scratch = final.with_name(f".{final.name}.building-{uuid.uuid4().hex[:8]}")
    shutil.rmtree(final, ignore_errors=True)  # left by a builder that died after its rename
    progress = Progress(show=_show_progress(version.pk))
    try:
        with _collector_relaxed():
            shards = _build_shards(spec, scratch, progress, curation_version())
            manifest = merge_shards(shards, out_dir=scratch)
        for shard_dir in scratch.glob(f"{SHARD_PREFIX}*"):
            shard_dir.rmdir()  # emptied by the merge
        manifest["store"] = {"runs_read": progress.runs, "steps_read": progress.steps}
        manifest["split_check"] = split_note(spec, manifest["splits"], forced=version.forced_warnings)
        (scratch / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        scratch.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


def _build_shards(spec: DatasetSpec, out_dir: Path, progress: Progress, curation: str) -> list[Shard]:
    """The build's shards: made by READERS forked processes side by side when it can be (`_shards_aside`),
    else one shard, here."""
    if READ_ASIDE and connection.vendor == "postgresql" and not connection.in_atomic_block:
        return _shards_aside(spec, out_dir, progress, curation)
    return [distill_shard(_labelled(spec, progress), spec, out_dir=out_dir, curation_version=curation)]


def _labelled(
    spec: DatasetSpec, progress: Progress, share: tuple[int, int] | None = None
) -> Iterator[SourceRun]:
    """The spec's runs (those of one share, if given), writing each batch's rubric labels as it passes
    (a batch or two in memory at a time)."""
    for batch in _labelled_batches(spec, progress, share=share):
        yield from batch


def _labelled_batches(
    spec: DatasetSpec, progress: Progress, *, share: tuple[int, int] | None = None
) -> Iterator[list[StoredRun]]:
    """The read path's batches (of one share of the runs, if given), each run's rubric made and each
    batch's labels written. When the build keeps digests (`digests_kept`), each run read with its steps
    gets its digest derived and kept, and runs come as their kept digest where they have one."""
    keep_digests = digests_kept(spec)
    for batch in source_run_batches(spec, progress=progress, share=share, digests=keep_digests):
        yield _labelled_batch(batch, keep_digests=keep_digests)


def _labelled_batch(batch: list[StoredRun], *, keep_digests: bool) -> list[StoredRun]:
    """A batch with its rubric labels written (and, with `keep_digests`, the digests of the runs read with
    their steps derived and kept)."""
    if keep_digests:
        batch = [_digested(run) for run in batch]
    read = [run for run in batch if run.record.steps or run.digest is not None]
    labels = {run.row_id: _label_changes(run) for run in read}  # the rubric, made here
    rubric_labels_write(runs=read, labels=labels)
    if keep_digests:
        digests_write(read, labels)
    return batch


def digest_pending_runs() -> QuerySet[Trajectory]:
    """Runs a value build would read (finished, with an outcome and steps) that have no digest of this
    version kept (nor a failed attempt at one: `TrajectoryDigest.error`), oldest first."""
    kept = TrajectoryDigest.objects.filter(version=DIGEST_VERSION).values("trajectory_id")
    return (
        Trajectory.objects.exclude(status__in=UNUSABLE_STATUSES)
        .filter(Q(success__isnull=False) | Q(reward__isnull=False))
        .filter(Exists(Step.objects.filter(trajectory_id=OuterRef("pk"))))
        .exclude(id__in=kept)
        .order_by("id")
    )


def digests_derive_pending(*, limit: int = PENDING_DIGESTS) -> int:
    """Derive and keep the digests (and write the rubric labels) of up to `limit` runs that have none
    (`digest_pending_runs`), so builds find them kept: the beat's `trove.datasets.digest_pending` calls
    this after ingest, whichever path stored the run, and `manage.py digest_runs` backfills a store.
    Postgres only (elsewhere builds keep no digests): returns how many runs were derived."""
    return digests_derive_next(limit=limit)[1]


def digests_derive_next(*, limit: int = PENDING_DIGESTS) -> tuple[list[int], int]:
    """`digests_derive_pending`, saying also which runs it took: (their ids, how many were derived). A
    caller going through the whole queue needs the first: a batch in which every run failed derives none,
    yet the runs after it are still pending."""
    if connection.vendor != "postgresql":
        return [], 0
    ids = list(digest_pending_runs().values_list("id", flat=True)[:limit])
    if not ids:
        return [], 0
    spec = DatasetSpec(kind="value", include_duplicates=True, include_rejected=True)
    derived = 0
    for batch in stored_run_batches(Trajectory.objects.filter(id__in=ids), spec):
        ready, failed = _each_digested(batch)
        derived += sum(1 for run in _labelled_batch(ready, keep_digests=True) if run.digest is not None)
        digest_failures_write(failed)
    return ids, derived


def _each_digested(batch: list[StoredRun]) -> tuple[list[StoredRun], dict[int, str]]:
    """The batch with each run's digest derived, but for the runs whose derivation raised (left out, with
    the error by id): one run the detectors choke on must not stop the others, nor be tried for ever."""
    ready: list[StoredRun] = []
    failed: dict[int, str] = {}
    for run in batch:
        try:
            ready.append(_digested(run))
        except Exception as error:  # noqa: BLE001 - recorded on the run's digest row, and logged
            log.warning("run %s: its digest could not be derived", run.row_id, exc_info=True)
            failed[run.row_id] = f"{type(error).__name__}: {error}"
    return ready, failed


def _digested(run: StoredRun) -> StoredRun:
    """A run read with its steps, with its digest derived (`distill.digest.derive`) for its rows and to
    keep; any other run as it is."""
    if not run.record.steps or run.digest is not None:
        return run
    scored = run.scored
    digested = dataclasses.replace(run, digest=derive(run.record, scored))
    digested.__dict__["scored"] = scored  # the copy's cached rubric: made once, read again for the labels
    return digested


def _shards_aside(spec: DatasetSpec, out_dir: Path, progress: Progress, curation: str) -> list[Shard]:
    """READERS forked processes, each on its own database connection, each building the shard of the runs
    whose task falls to it (`source_run_batches(share=...)`: whole tasks, as pairs and balancing need)
    into a directory of its own: reading the store, the rubric, the rows and writing them, side by side on
    as many cores. They report progress and hand back their `Shard` (its manifest and file list) through
    one queue; `merge_shards` puts them together. Like the read path's prefetch, only outside a transaction
    (a reader cannot see what this connection has not committed). An error in a reader is raised here, as
    is a reader that ended without a word; the readers are ended if this side stops first."""
    context = multiprocessing.get_context("fork")
    reports: Any = context.Queue()
    readers = [
        context.Process(
            target=_shard_main,
            args=(spec, (index, READERS), out_dir / f"{SHARD_PREFIX}{index}", curation, reports),
            name=f"dataset-shard-{index}",
            daemon=True,
        )
        for index in range(READERS)
    ]
    for reader in readers:
        reader.start()
    try:
        return _shards_collected(readers, reports, progress)
    finally:
        for reader in readers:
            if reader.is_alive():
                reader.terminate()
            reader.join()


def _shards_collected(readers: list[Any], reports: Any, progress: Progress) -> list[Shard]:
    """The readers' shards, in reader order, their progress added up into `progress` as it comes. A reader
    found ended without handing back its shard, and still so READER_PATIENCE_S later (time enough for
    anything it sent before it ended to arrive), was killed or crashed: raised as an error."""
    shards: dict[int, Shard] = {}
    counted = [(0, 0)] * len(readers)
    ended_at: dict[int, float] = {}  # readers found ended without their shard, and when
    while len(shards) < len(readers):
        try:
            index, kind, value = reports.get(timeout=READER_PATIENCE_S)
        except queue.Empty:
            index, kind, value = -1, "", None
        if kind == "error":
            raise value
        if kind:
            runs, steps = value[:2]
            progress.add(runs=runs - counted[index][0], steps=steps - counted[index][1])
            counted[index] = (runs, steps)
        if kind == "done":
            shards[index] = _shard_received(Path(value[2]))
        _check_ended(readers, shards, ended_at)
    return [shards[index] for index in range(len(readers))]


def _check_ended(readers: list[Any], done: Mapping[int, Shard], ended_at: dict[int, float]) -> None:
    now = time.monotonic()
    for index, reader in enumerate(readers):
        if index in done or reader.exitcode is None:
            continue
        if now - ended_at.setdefault(index, now) >= READER_PATIENCE_S:
            raise RuntimeError(
                f"dataset reader {index} ended (exit code {reader.exitcode}) before it finished its shard"
            )


def _shard_received(path: Path) -> Shard:
    """A reader's shard, from the file it left it in (the queue carries only its name: a pickle bigger
    than the pipe's buffer would keep a reader whose parent died waiting to write it, forever)."""
    shard = pickle.loads(path.read_bytes())
    path.unlink()
    return shard


def _shard_main(
    spec: DatasetSpec, share: tuple[int, int], out_dir: Path, curation: str, reports: Any
) -> None:
    """A reader process, on fresh connections (the inherited ones belong to the parent, whose session
    holds the build's lock: they are set aside, never closed, and the process ends with os._exit). It ends
    itself if the parent dies (nobody would merge its shard)."""
    for alias in connections.all():
        _PARENT_CONNECTIONS.append(alias.connection)  # kept alive: closing one would end the parent's
        alias.connection = None
    _collect_less()
    parent, index = os.getppid(), share[0]

    def report(runs: int, steps: int) -> None:
        if os.getppid() != parent:
            os._exit(1)
        reports.put((index, "progress", (runs, steps)))

    try:
        progress = Progress(show=report)
        shard = distill_shard(
            _labelled(spec, progress, share), spec, out_dir=out_dir, curation_version=curation
        )
        result = out_dir / SHARD_RESULT
        result.write_bytes(pickle.dumps(shard, protocol=pickle.HIGHEST_PROTOCOL))
        reports.put((index, "done", (progress.runs, progress.steps, str(result))))
    except BaseException as error:  # noqa: BLE001 - handed to the parent, which raises it
        reports.put((index, "error", _picklable(error)))
    finally:
        connections.close_all()
        reports.close()
        reports.join_thread()


def _collect_less() -> None:
    """Make the reader's garbage collections rare and small. It allocates millions of short-lived,
    acyclic objects (records, messages, rubric states) that reference counting frees, yet each 700
    allocations start a collection, and the older ones walk every object the process holds, the parent's
    inherited heap included: a quarter of the reader's CPU. The inherited objects are frozen (never
    collected here, and never touched, so their pages stay shared with the parent) and collections start
    after READER_GC_THRESHOLD allocations; the few cycles are still collected."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(READER_GC_THRESHOLD, middle, oldest)


_relaxed_guard = threading.Lock()
_relaxed = (
    0  # builds in this process running with the raised threshold now (a threads-pool worker runs several)
)
_threshold_before: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def _collector_relaxed() -> Iterator[None]:
    """Young collections every BUILD_GC_THRESHOLD allocations instead of 700 while any build in this
    process runs; the threshold found before the first is restored after the last. A build allocates
    millions of short-lived, acyclic objects (rows, JSON lines, Parquet columns) that reference counting
    frees, yet each 700 allocations started a collection, the older ones walking the rows a Parquet row
    group holds: 1.5 CPU-s per 100,000 steps, against 0.1 s with the raised threshold."""
    global _relaxed, _threshold_before
    with _relaxed_guard:
        if _relaxed == 0:
            _threshold_before = gc.get_threshold()
            gc.set_threshold(BUILD_GC_THRESHOLD, *_threshold_before[1:])
        _relaxed += 1
    try:
        yield
    finally:
        with _relaxed_guard:
            _relaxed -= 1
            if _relaxed == 0:
                gc.set_threshold(*_threshold_before)


_PARENT_CONNECTIONS: list[Any] = []  # in a reader process: the parent's connections, never to be closed


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error that does not survive the trip is named instead
        return RuntimeError(f"dataset reader: {type(error).__name__}: {error}")
    return error


def _show_progress(version_id: int) -> Callable[[int, int], None]:
    """Shows the read path's counts on the building version, for the page that watches it."""

    def show(runs: int, steps: int) -> None:
        progress = {"progress": {"runs_read": runs, "steps_read": steps}}
        DatasetVersion.objects.filter(pk=version_id, status=DatasetVersion.Status.BUILDING).update(
            manifest=progress
        )

    return show


def _mark_ready(version: DatasetVersion, manifest: dict[str, Any]) -> DatasetVersion:
    relative = version_dir(version).relative_to(settings.TROVE_DATASET_DIR)
    files = {entry["name"]: str(relative / entry["name"]) for entry in manifest["files"]}
    files[MANIFEST_FILE] = str(relative / MANIFEST_FILE)
    DatasetVersion.objects.filter(pk=version.pk, status=DatasetVersion.Status.BUILDING).update(
        status=DatasetVersion.Status.READY, manifest=manifest, content_hash=manifest["content_hash"],
        row_count=manifest["rows"], files=files, error="", finished_at=timezone.now(),
    )  # fmt: skip
    version.refresh_from_db()
    return version


def _mark_failed(version: DatasetVersion, error: str) -> DatasetVersion:
    DatasetVersion.objects.filter(pk=version.pk, status=DatasetVersion.Status.BUILDING).update(
        status=DatasetVersion.Status.FAILED, error=error, manifest={}, finished_at=timezone.now()
    )
    version.refresh_from_db()
    return version


def dataset_version_fail(*, version_id: int, error: str) -> DatasetVersion:
    """Give up on a version still building (a task out of retries). A finished version is left alone."""
    return _mark_failed(_version(version_id), error)


def curation_version() -> str:
    """Where curation stood at build time: the latest curation event (they are append-only)."""
    latest = CurationEvent.objects.aggregate(n=Max("id"))["n"]
    return f"curation-event-{latest or 0}"


# --- rubric labels ---------------------------------------------------------------------------------------


def rubric_labels_write(
    *, runs: list[StoredRun], labels: Mapping[int, list[tuple[str, bool, int | None]]] | None = None
) -> int:
    """Store each run's rubric as Label rows (source `rubric`, version RUBRIC_VERSION), one per
    detector: `value` is the run's final label, `step` the step after which it took that value (None
    when it held from the start). Runs already labelled at this version are skipped, and a run another
    writer labels at the same moment (a build and the beat reading the same run) is written once: the
    rows go in with ON CONFLICT DO NOTHING against the `label_rubric_once_per_version` constraint.
    Returns rows written. On Postgres the batch's rows go in one statement, its columns as arrays (7 rows
    a run: a parameter per value and Label objects cost more than the rubric's detectors); elsewhere one
    bulk insert. `labels`: each run's `_label_changes`, when the caller has them.
    """
    ids = [run.row_id for run in runs]
    done = set(
        Label.objects.filter(trajectory_id__in=ids, source=LABEL_SOURCE, version=RUBRIC_VERSION)
        .values_list("trajectory_id", flat=True)
        .distinct()
    )
    changes = labels if labels is not None else {run.row_id: _label_changes(run) for run in runs}
    rows = [
        (run.row_id, step_id, name, value)
        for run in runs
        if run.row_id not in done
        for name, value, step_id in changes[run.row_id]
    ]
    if connection.vendor == "postgresql":
        return _insert_labels(rows)
    Label.objects.bulk_create(
        [
            Label(
                trajectory_id=trajectory_id,
                step_id=step_id,
                name=name,
                value=value,
                source=LABEL_SOURCE,
                version=RUBRIC_VERSION,
            )
            for trajectory_id, step_id, name, value in rows
        ],
        batch_size=2000,
        ignore_conflicts=True,
    )
    return len(rows)


_LABEL_INSERT = f"""
INSERT INTO {Label._meta.db_table} (trajectory_id, step_id, name, value, source, version, created_at)
SELECT r.trajectory_id, r.step_id, r.name, r.value::jsonb, %s, %s, %s
FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) AS r(trajectory_id, step_id, name, value)
ON CONFLICT (trajectory_id, source, version, name) WHERE source = '{LABEL_SOURCE}' DO NOTHING
"""


def _insert_labels(rows: list[tuple[int, int | None, str, bool]]) -> int:
    """The rows in one INSERT (`value` is jsonb: its JSON text); returns how many went in."""
    if not rows:
        return 0
    trajectories, steps, names, values = (list(column) for column in zip(*rows, strict=True))
    texts = ["true" if value else "false" for value in values]
    with connection.cursor() as cursor:
        # One moment for the batch, as one INSERT statement's rows would nearly share.
        cursor.execute(
            _LABEL_INSERT, [LABEL_SOURCE, RUBRIC_VERSION, timezone.now(), trajectories, steps, names, texts]
        )
        return cursor.rowcount


def _label_changes(run: StoredRun) -> list[tuple[str, bool, int | None]]:
    """(name, value, step id) of a run's labels, in LABELS order: each label's final value and the step
    after which it took it (None when it held from the start). From its kept digest when it was read as
    one, else from its rubric."""
    if run.digest_labels is not None:
        return list(run.digest_labels)
    return [
        (name, value, run.step_ids[at] if at is not None else None)
        for name, value, at in run.scored.label_changes()
    ]


# --- reading versions ------------------------------------------------------------------------------------


def dataset_list() -> QuerySet[Dataset]:
    return Dataset.objects.order_by("name").annotate(
        n_versions=Count("versions"), latest_version=Max("versions__version")
    )


def dataset_get(*, ref: int | str) -> Dataset:
    """A dataset by id or by name."""
    query = Q(pk=int(ref)) if str(ref).isdigit() else Q(name=ref)
    dataset = Dataset.objects.filter(query).first()
    if dataset is None:
        raise NotFound(f"dataset {ref!r} does not exist", field="dataset")
    return dataset


def dataset_version_get(*, dataset: Dataset, version: int) -> DatasetVersion:
    found = DatasetVersion.objects.select_related("dataset").filter(dataset=dataset, version=version).first()
    if found is None:
        raise NotFound(f"dataset {dataset.name!r} has no version {version}", field="version")
    return found


def dataset_version_resolve(*, ref: str) -> DatasetVersion:
    """A version from `name@3` (or `name:3`, `name/3`, `name v3`) or a bare version id."""
    text = ref.strip()
    if text.isdigit():
        return _version(int(text))
    match = re.match(r"^(?P<name>.+?)[@:/ ]v?(?P<version>\d+)$", text)
    if match is None:
        raise ValidationError(f"version: {ref!r} is not NAME@VERSION or a version id", field="version")
    return dataset_version_get(dataset=dataset_get(ref=match["name"]), version=int(match["version"]))


def version_file(*, version: DatasetVersion, name: str) -> Path:
    """The path of one of a ready version's files (NotFound for a name the version does not list)."""
    if version.status != DatasetVersion.Status.READY or name not in version.files:
        raise NotFound(f"{version} has no file {name!r}", field="name")
    path = Path(settings.TROVE_DATASET_DIR) / version.files[name]
    if not path.is_file():
        raise NotFound(f"{version}'s file {name!r} is missing from the dataset directory", field="name")
    return path


def version_rows(*, version: DatasetVersion, split: str) -> Iterator[dict[str, Any]]:
    """A ready version's rows of one split, read back from its JSONL.gz parts one line at a time."""
    for name in split_parts(version.files, split, "jsonl.gz"):
        with gzip.open(version_file(version=version, name=name), "rt", encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)


def version_compare(*, a: DatasetVersion, b: DatasetVersion) -> dict[str, Any]:
    """What changed from version a to version b: spec fields, counts per split, tasks and source runs."""
    ma, mb = a.manifest or {}, b.manifest or {}
    spec_a, spec_b = a.spec or {}, b.spec or {}
    runs_a, runs_b = set(ma.get("source_trajectory_ids", [])), set(mb.get("source_trajectory_ids", []))
    tasks_a, tasks_b = ma.get("task_rows", {}), mb.get("task_rows", {})
    splits = {}
    for split in ("train", "val", "test"):
        sa, sb = ma.get("splits", {}).get(split, {}), mb.get("splits", {}).get(split, {})
        splits[split] = {"a": sa, "b": sb, "rows_delta": (sb.get("rows") or 0) - (sa.get("rows") or 0)}
    return {
        "a": {"dataset": a.dataset.name, "version": a.version, "status": a.status},
        "b": {"dataset": b.dataset.name, "version": b.version, "status": b.status},
        "same_content": bool(a.content_hash) and a.content_hash == b.content_hash,
        "spec_changes": {
            key: {"a": spec_a.get(key), "b": spec_b.get(key)}
            for key in sorted(set(spec_a) | set(spec_b))
            if spec_a.get(key) != spec_b.get(key)
        },
        "rows": {"a": a.row_count, "b": b.row_count, "delta": b.row_count - a.row_count},
        "splits": splits,
        "runs": {
            "added": len(runs_b - runs_a),
            "removed": len(runs_a - runs_b),
            "kept": len(runs_a & runs_b),
        },
        "tasks": {
            "added": sorted(set(tasks_b) - set(tasks_a)),
            "removed": sorted(set(tasks_a) - set(tasks_b)),
            "changed": {
                k: {"a": tasks_a[k], "b": tasks_b[k]}
                for k in sorted(set(tasks_a) & set(tasks_b))
                if tasks_a[k] != tasks_b[k]
            },
        },  # fmt: skip
        "metrics": {"a": a.metrics or {}, "b": b.metrics or {}},
    }
