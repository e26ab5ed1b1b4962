"""Datasets: a spec stored as a `Dataset`, each build an immutable `DatasetVersion` with files on disk.

This is the database side of distillation; `experience.distill` is the algorithm. A build streams the
runs the spec's filters select out of Postgres, ordered by (task key, id), into `distill.build.distill`,
which writes one JSONL.gz and one Parquet file per split under
`TROVE_DATASET_DIR/<dataset name>/<version>/` and returns the manifest.

The read path never holds the store in memory: trajectory rows come through a server-side cursor
(`iterator(chunk_size=...)`), and their steps and blobs are fetched a batch of runs at a time (a few
thousand steps), so memory is bounded by the batch, not by the store. Runs the spec leaves out
(duplicates, rejected, unfinished, no outcome) are passed on without their steps: the manifest still
counts them, and nothing reads their steps.

Filters (`Dataset.filters`, all optional, combined with AND): `task_sets`, `task_keys`, `models`,
`harnesses`, `sources` (lists: the run matches any), `outcome` (`success` | `failure`), `curation`
(list of curation statuses), `created_after` / `created_before` (ISO dates or datetimes, on when the run
was stored; after is inclusive, before exclusive), `tags` (list: the run carries all of them). Lists are
sorted and de-duplicated, so equal filters give an equal spec and the same content hash.

Versions are immutable: a build writes into a scratch directory and renames it into place only when the
manifest is complete, and a ready version is never built again (a rebuild is a new version). A build
whose spec matches nothing fails with `EmptyDatasetError` naming the reason and leaves no files.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from datetime import time as dt_time
from pathlib import Path
from typing import Any, NamedTuple

import zstandard
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from experience.distill.build import distill
from experience.distill.errors import EmptyDatasetError, SpecError
from experience.distill.rubric import LABELS, RUBRIC_VERSION, labels_of, rubric
from experience.distill.selection import exclusion_reason
from experience.distill.source import CURATION_REJECTED, UNUSABLE_STATUSES, SourceRun
from experience.distill.spec import DatasetSpec
from experience.errors import Conflict, NotFound, TroveError, ValidationError
from experience.models import Blob, CurationEvent, Dataset, DatasetVersion, Label, Step, Trajectory
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.steps import referenced_hashes, step_record_from_parts

log = logging.getLogger("trove.datasets")
_zstd = zstandard.ZstdDecompressor()

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
LIST_FILTERS = ("task_sets", "task_keys", "models", "harnesses", "sources", "curation", "tags")
DATE_FILTERS = ("created_after", "created_before")
OUTCOMES = ("success", "failure")
FILTER_KEYS = (*LIST_FILTERS, *DATE_FILTERS, "outcome")
# Batch bounds of the read path: a batch is this many runs, or fewer once their steps reach STEP_BATCH.
RUN_BATCH = 500
STEP_BATCH = 5000
BLOB_QUERY = 5000  # hashes per blob query
SQLITE_BLOB_QUERY = 500  # SQLite caps the parameters of one statement
REQUEST_MESSAGES = "request_messages"  # the blob_refs key of a model call's context (experience.steps)
PROGRESS_EVERY_S = 2.0
LABEL_SOURCE = "rubric"
MANIFEST_FILE = "manifest.json"

TRAJECTORY_COLUMNS = (
    "id", "source", "source_format", "source_version", "source_ref", "task_set", "task_key", "instruction",
    "harness", "model", "status", "reward", "success", "started_at", "finished_at", "cost", "final_diff",
    "metadata", "n_steps", "curation_status", "is_duplicate", "tags",
)  # fmt: skip
STEP_COLUMNS = (
    "id", "trajectory_id", "seq", "kind", "started_at", "ended_at", "duration_ms", "tokens_in", "tokens_out",
    "exit_code", "is_error", "call_id", "payload", "blob_refs",
)  # fmt: skip
_TEXT_COLUMNS = ("started_at", "ended_at", "payload", "blob_refs")
_STEPS_SQL = (
    f"SELECT {', '.join(f'{c}::text' if c in _TEXT_COLUMNS else c for c in STEP_COLUMNS)} "
    f"FROM {Step._meta.db_table} WHERE trajectory_id = ANY(%s) ORDER BY trajectory_id, seq"
)
_BLOBS_SQL = f"SELECT sha256, encoding, data FROM {Blob._meta.db_table} WHERE sha256 = ANY(%s)"
# Record fields that come straight from a trajectory column of the same name.
_RECORD_COLUMNS = (
    "source", "source_format", "source_version", "source_ref", "task_set", "task_key", "instruction",
    "harness", "model", "status", "reward", "success", "started_at", "finished_at", "cost", "final_diff",
    "metadata",
)  # fmt: skip


# --- specs and filters -----------------------------------------------------------------------------------


def filters_clean(filters: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated, canonical filters. Raises `ValidationError` naming the bad field (`filters.<key>`)."""
    if filters is None:
        return {}
    if not isinstance(filters, Mapping):
        raise ValidationError("filters: must be a JSON object", field="filters")
    cleaned: dict[str, Any] = {}
    for key in sorted(filters):
        value = filters[key]
        if key not in FILTER_KEYS:
            raise ValidationError(
                f"filters.{key}: not a filter (one of {', '.join(FILTER_KEYS)})", field=f"filters.{key}"
            )
        if value in (None, [], ""):
            continue  # an empty filter is no filter: keep the spec canonical
        cleaned[key] = _clean_filter(key, value)
    return cleaned


def _clean_filter(key: str, value: Any) -> Any:
    field = f"filters.{key}"
    if key in LIST_FILTERS:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise ValidationError(f"{field}: must be a list of names", field=field)
        if key == "curation":
            bad = sorted(set(value) - set(Trajectory.Curation.values))
            if bad:
                choices = ", ".join(Trajectory.Curation.values)
                raise ValidationError(f"{field}: {bad[0]!r} is not one of {choices}", field=field)
        return sorted(set(value))
    if key == "outcome":
        if value not in OUTCOMES:
            raise ValidationError(
                f"{field}: must be one of {', '.join(OUTCOMES)}, not {value!r}", field=field
            )
        return value
    _parse_moment(value, field)
    return value


def _parse_moment(value: Any, field: str) -> datetime:
    """An ISO date (midnight, in the server's time zone) or datetime."""
    if isinstance(value, str):
        moment = parse_datetime(value)
        if moment is None and (day := parse_date(value)) is not None:
            moment = datetime.combine(day, dt_time.min)
        if moment is not None:
            return moment if timezone.is_aware(moment) else timezone.make_aware(moment)
    raise ValidationError(f"{field}: must be an ISO date or datetime, not {value!r}", field=field)


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


def runs_matching(filters: Mapping[str, Any]) -> QuerySet[Trajectory]:
    """Trajectories the filters select (tags aside on databases without JSON containment; see
    `_tags_match`), in no particular order."""
    query = Q()
    for key, column in (
        ("task_sets", "task_set"),
        ("task_keys", "task_key"),
        ("models", "model"),
        ("harnesses", "harness"),
        ("sources", "source"),
        ("curation", "curation_status"),
    ):
        if filters.get(key):
            query &= Q(**{f"{column}__in": filters[key]})
    if filters.get("outcome") == "success":
        query &= Q(success=True) | Q(success__isnull=True, reward__gt=0)
    elif filters.get("outcome") == "failure":
        query &= Q(success=False) | Q(success__isnull=True, reward__lte=0)
    if filters.get("created_after"):
        query &= Q(created_at__gte=_parse_moment(filters["created_after"], "filters.created_after"))
    if filters.get("created_before"):
        query &= Q(created_at__lt=_parse_moment(filters["created_before"], "filters.created_before"))
    if filters.get("tags") and connection.vendor == "postgresql":
        query &= Q(tags__contains=filters["tags"])
    return Trajectory.objects.filter(query)


def _tags_match(tags: Any, wanted: list[str]) -> bool:
    """The tag filter in Python, for SQLite (the embedded default), which has no JSON containment."""
    return isinstance(tags, list) and set(wanted) <= set(tags)


def usable_runs(spec: DatasetSpec) -> QuerySet[Trajectory]:
    """The matching runs `distill.selection.exclusion_reason` would keep, as SQL (the precheck's count)."""
    runs = runs_matching(spec.filters).exclude(status__in=UNUSABLE_STATUSES)
    runs = runs.exclude(success__isnull=True, reward__isnull=True)
    if not spec.include_duplicates:
        runs = runs.filter(is_duplicate=False)
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
    if spec.kind == "pairwise" and not _task_with_both_outcomes(usable):
        raise EmptyDatasetError(
            "no task has both a successful and a failed run among the usable runs, so there is no pair"
        )


def _describe_filters(filters: Mapping[str, Any]) -> str:
    return json.dumps(filters, sort_keys=True) if filters else "(none: the store holds no runs)"


def _exclusions(matching: QuerySet[Trajectory], spec: DatasetSpec) -> str:
    """Counts per reason, in the order `exclusion_reason` tries them (each run counted once)."""
    reasons: list[tuple[str, Q]] = []
    if not spec.include_duplicates:
        reasons.append(("duplicate", Q(is_duplicate=True)))
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
    # Usable runs have a success flag or a reward, so these two cover each of them exactly once.
    won = Q(success=True) | Q(success__isnull=True, reward__gt=0)
    lost = Q(success=False) | Q(success__isnull=True, reward__lte=0)
    per_task = usable.values("task_key").annotate(won=Count("id", filter=won), lost=Count("id", filter=lost))
    return per_task.filter(won__gt=0, lost__gt=0).exists()


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
    *, dataset: Dataset, enqueue: Callable[[int], None] | None = None
) -> DatasetVersion:
    """Record a new version to build (status `building`) and hand its id to `enqueue` after commit.

    Checks first that the spec can give rows (`EmptyDatasetError` otherwise, and nothing is recorded).
    Version numbers are handed out under a row lock on the dataset, so two requests never share one.
    """
    spec = dataset_spec(dataset)
    check_spec_matches(spec)
    with transaction.atomic():
        Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
        latest = dataset.versions.aggregate(n=Max("version"))["n"] or 0
        version = DatasetVersion.objects.create(dataset=dataset, version=latest + 1, spec=spec.to_dict())
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
    progress = _Progress(version.pk)
    try:
        manifest = distill(
            _labelled(spec, progress), spec, out_dir=scratch, curation_version=curation_version()
        )
        manifest["store"] = {"runs_read": progress.runs, "steps_read": progress.steps}
        (scratch / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        scratch.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


def _labelled(spec: DatasetSpec, progress: _Progress) -> Iterator[SourceRun]:
    """The spec's runs, writing each batch's rubric labels as it passes (one batch in memory at a time)."""
    for batch in source_run_batches(spec, progress=progress):
        rubric_labels_write(runs=[run for run in batch if run.record.steps])
        yield from batch


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


class _Progress:
    """Counts what the read path has read and shows it on the building version, every few seconds."""

    def __init__(self, version_id: int | None) -> None:
        self.version_id = version_id
        self.runs = 0
        self.steps = 0
        self._shown = 0.0

    def add(self, *, runs: int, steps: int) -> None:
        self.runs += runs
        self.steps += steps
        now = time.monotonic()
        if self.version_id is not None and now - self._shown >= PROGRESS_EVERY_S:
            self._shown = now
            progress = {"progress": {"runs_read": self.runs, "steps_read": self.steps}}
            DatasetVersion.objects.filter(pk=self.version_id, status=DatasetVersion.Status.BUILDING).update(
                manifest=progress
            )


# --- the read path ---------------------------------------------------------------------------------------


def source_runs(spec: DatasetSpec) -> Iterator[SourceRun]:
    """The runs the spec's filters select, ordered by (task key, id), as SourceRuns, streamed.

    Runs the spec will leave out come without their steps (nothing downstream reads them).
    """
    for batch in source_run_batches(spec):
        yield from batch


def source_run_batches(spec: DatasetSpec, *, progress: _Progress | None = None) -> Iterator[list[StoredRun]]:
    """`source_runs` a batch at a time: at most RUN_BATCH runs or about STEP_BATCH steps."""
    wanted_tags = spec.filters.get("tags") if connection.vendor != "postgresql" else None
    keep = (lambda row: _tags_match(row["tags"], wanted_tags)) if wanted_tags else None
    return stored_run_batches(runs_matching(spec.filters), spec, progress=progress, keep=keep)


def stored_run_batches(
    trajectories: QuerySet[Trajectory],
    spec: DatasetSpec,
    *,
    progress: _Progress | None = None,
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> Iterator[list[StoredRun]]:
    """The trajectories as StoredRuns ordered by (task key, id), in batches; only the runs the spec
    uses get their steps. `keep`: a test on each trajectory row (TRAJECTORY_COLUMNS) made in Python,
    before any step is read, for what SQL here does not say."""
    progress = progress or _Progress(None)
    columns = trajectories.order_by("task_key", "id").values_list(*TRAJECTORY_COLUMNS)
    # A server-side cursor: trajectory rows arrive RUN_BATCH at a time, never all at once.
    rows: Iterable[dict[str, Any]] = (
        dict(zip(TRAJECTORY_COLUMNS, values, strict=True))
        for values in columns.iterator(chunk_size=RUN_BATCH)
    )
    if keep is not None:
        rows = filter(keep, rows)
    for batch in _batches(rows):
        runs = _batch_runs(batch, spec)
        progress.add(runs=len(batch), steps=sum(len(run.record.steps) for run in runs))
        yield runs


def _batches(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    steps = 0
    for row in rows:
        batch.append(row)
        steps += row["n_steps"]
        if len(batch) >= RUN_BATCH or steps >= STEP_BATCH:
            yield batch
            batch, steps = [], 0
    if batch:
        yield batch


def _batch_runs(batch: list[dict[str, Any]], spec: DatasetSpec) -> list[StoredRun]:
    """A batch's runs; steps and blobs come in one query each, only for the runs the spec uses."""
    bare = [_stored_run(row, None) for row in batch]
    needed = [run.row_id for run in bare if exclusion_reason(run, spec) is None]
    steps_of = _steps_of(needed) if needed else {}
    return [
        _stored_run(row, steps_of[row["id"]]) if row["id"] in steps_of else run
        for row, run in zip(batch, bare, strict=True)
    ]


class _StepRow(NamedTuple):
    id: int
    record: StepRecord
    text: str  # the row's columns as Postgres renders them: what the run's content hash reads


def _steps_of(trajectory_ids: list[int]) -> dict[int, list[_StepRow]]:
    """The runs' steps, rebuilt as StepRecords, in seq order, per run."""
    parsed = [(row, json.loads(row[13])) for row in _step_rows(trajectory_ids)]
    blobs = _blobs(h for _row, refs in parsed for h in referenced_hashes(refs))
    messages = _MessageCache(blobs)
    grouped: dict[int, list[_StepRow]] = {trajectory_id: [] for trajectory_id in trajectory_ids}
    for row, refs in parsed:
        text = "\t".join(map(str, row[2:]))
        grouped[row[1]].append(_StepRow(row[0], _step_record(row, refs, blobs, messages), text))
    return grouped


def _step_rows(trajectory_ids: list[int]) -> list[tuple]:
    """The runs' step rows (STEP_COLUMNS; timestamps and JSON as text), ordered by (run, seq).

    On Postgres, raw SQL because this is the hot path: one `= ANY(array)` parameter instead of thousands
    of IN placeholders, and jsonb and timestamps fetched as Postgres's text (canonical for jsonb), which the
    content hash reads as it is. Elsewhere (SQLite, the embedded default) the ORM, rendering the same text.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_STEPS_SQL, [trajectory_ids])
            return cursor.fetchall()
    rows = (
        Step.objects.filter(trajectory_id__in=trajectory_ids)
        .order_by("trajectory_id", "seq")
        .values_list(*STEP_COLUMNS)
    )
    return [(*r[:4], _iso(r[4]), _iso(r[5]), *r[6:12], _json_text(r[12]), _json_text(r[13])) for r in rows]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _blobs(hashes: Iterable[str]) -> dict[str, bytes]:
    """Blob contents by hash, BLOB_QUERY hashes a query (`= ANY(array)` on Postgres)."""
    wanted = list(dict.fromkeys(hashes))
    found: dict[str, bytes] = {}
    postgres = connection.vendor == "postgresql"
    size = BLOB_QUERY if postgres else SQLITE_BLOB_QUERY
    with connection.cursor() as cursor:
        for start in range(0, len(wanted), size):
            chunk = wanted[start : start + size]
            if postgres:
                cursor.execute(_BLOBS_SQL, [chunk])
                rows = cursor.fetchall()
            else:
                rows = Blob.objects.filter(sha256__in=chunk).values_list("sha256", "encoding", "data")
            found.update((digest, _decoded(encoding, data)) for digest, encoding, data in rows)
    return found


def _decoded(encoding: str, data: bytes | memoryview) -> bytes:
    raw = bytes(data)
    return _zstd.decompress(raw) if encoding == "zstd" else raw


class _MessageCache(dict):
    """Each context message of a batch parsed once and shared by every model call whose context holds it.

    A run's context grows by a message or two per call, so rebuilding each call's context on its own
    parses O(calls^2) messages; sharing parses each distinct message once, as importers share them. The
    records are read-only downstream. A dict, so a hit is a plain lookup: there are O(calls^2) of them.
    """

    def __init__(self, blobs: Mapping[str, bytes]) -> None:
        super().__init__()
        self._blobs = blobs

    def __missing__(self, digest: str) -> MessageRecord:
        message = self[digest] = MessageRecord(**json.loads(self._blobs[digest]))
        return message


def _step_record(
    row: tuple, refs: dict[str, Any], blobs: dict[str, bytes], messages: _MessageCache
) -> StepRecord:
    """A StepRecord from a `_STEPS_SQL` row, as `experience.steps.step_record_from_parts` rebuilds it,
    except that context messages come from the batch's shared cache."""
    context = refs.get(REQUEST_MESSAGES)
    if context is not None:
        refs = {name: value for name, value in refs.items() if name != REQUEST_MESSAGES}
    record = step_record_from_parts(
        kind=row[3], payload=json.loads(row[12]), blob_refs=refs, blobs=blobs,
        started_at=_moment(row[4]), ended_at=_moment(row[5]), duration_ms=row[6], tokens_in=row[7],
        tokens_out=row[8], exit_code=row[9], is_error=row[10], call_id=row[11],
    )  # fmt: skip
    if context is not None:
        record.request_messages = list(map(messages.__getitem__, context))
    return record


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


@dataclass(frozen=True)
class StoredRun(SourceRun):
    """A SourceRun read from the store: its row id and its step rows' ids (aligned with the record's
    steps), so labels and value estimates can be written back."""

    row_id: int = 0
    step_ids: tuple[int, ...] = ()


def _stored_run(row: Mapping[str, Any], steps: list[_StepRow] | None) -> StoredRun:
    """`steps` None: a run the spec leaves out, passed on without steps (and without a content hash)."""
    record = TrajectoryRecord(
        **{name: row[name] for name in _RECORD_COLUMNS}, steps=[step.record for step in steps or []]
    )
    return StoredRun(
        trajectory_id=str(row["id"]),
        record=record,
        content_hash=store_content_hash(row, steps) if steps is not None else "",
        curation=row["curation_status"],
        is_duplicate=row["is_duplicate"],
        row_id=row["id"],
        step_ids=tuple(step.id for step in steps or []),
    )


def store_content_hash(row: Mapping[str, Any], steps: list[_StepRow]) -> str:
    """sha256 of a run as stored: its record columns and every step row as Postgres renders it (blobs by
    their hashes, which name their content). Cheaper than hashing the rebuilt record (a context shared by
    50 calls is 50 short references, not 50 copies), and it changes with any change to the run."""
    digest = hashlib.sha256()
    head = {name: row[name] for name in _RECORD_COLUMNS}
    digest.update(json.dumps(head, sort_keys=True, default=str).encode("utf-8", "surrogatepass"))
    for step in steps:
        digest.update(b"\n")
        digest.update(step.text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


# --- rubric labels ---------------------------------------------------------------------------------------


def rubric_labels_write(*, runs: list[StoredRun]) -> int:
    """Store each run's rubric as Label rows (source `rubric`, version RUBRIC_VERSION), one per
    detector: `value` is the run's final label, `step` the step after which it took that value (None
    when it held from the start). Runs already labelled at this version are skipped. Returns rows written.
    """
    ids = [run.row_id for run in runs]
    done = set(
        Label.objects.filter(trajectory_id__in=ids, source=LABEL_SOURCE, version=RUBRIC_VERSION)
        .values_list("trajectory_id", flat=True)
        .distinct()
    )
    labels = [label for run in runs if run.row_id not in done for label in _run_labels(run)]
    Label.objects.bulk_create(labels, batch_size=2000)
    return len(labels)


def _run_labels(run: StoredRun) -> list[Label]:
    scored = rubric(run.record)
    final = scored.run_labels
    changed_at: dict[str, int] = {}  # label -> the step after which it last changed
    previous = labels_of(scored.state_before(0))
    for index, state in enumerate(scored.states):
        current = labels_of(state)
        changed_at.update((name, index) for name in LABELS if current[name] != previous[name])
        previous = current
    return [
        Label(
            trajectory_id=run.row_id,
            step_id=run.step_ids[changed_at[name]] if name in changed_at else None,
            name=name,
            value=final[name],
            source=LABEL_SOURCE,
            version=RUBRIC_VERSION,
        )
        for name in LABELS
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
    """A ready version's rows of one split, read back from its JSONL.gz file one line at a time."""
    name = f"{split}.jsonl.gz"
    if name not in version.files:
        return
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
