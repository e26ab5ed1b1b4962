"""Reading runs out of the store for distillation: filters to a queryset, and the streamed read path.

`source_runs(spec)` yields the runs a dataset spec's filters select as `StoredRun`s (SourceRuns that know
their row ids), ordered by (task key, id) as `experience.distill` needs them, without ever holding the
store in memory: trajectory rows come through a server-side cursor (`iterator(chunk_size=...)`), and
their steps and blobs are fetched a batch of runs at a time (RUN_BATCH runs or about STEP_BATCH steps),
so memory is bounded by the batch, not by the store. Outside a transaction the next batch is fetched
on a second connection while this one is rebuilt (`_Fetcher`). On Postgres, steps and blobs come through
psycopg's own cursor, in binary. A model call's context that extends the run's previous one (stored as a
delta, or as a full list: then seen by its text) is rebuilt from that one, so each message is parsed and
looked up once per batch (`experience.steps.ContextMessages`). Runs the spec leaves out (duplicates,
rejected, unfinished, no outcome) are passed on without their steps: the manifest still counts them,
and nothing reads their steps.

Filters (all optional, combined with AND): `task_sets`, `task_keys`, `models`, `harnesses`, `sources`
(lists: the run matches any), `outcome` (`success` | `failure`), `curation` (list of curation statuses),
`created_after` / `created_before` (ISO dates or datetimes, on when the run was stored; after is
inclusive, before exclusive), `tags` (list: the run carries all of them). Lists are sorted and
de-duplicated, so equal filters give an equal spec and the same content hash.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from datetime import time as dt_time
from typing import Any, NamedTuple

import psycopg
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Collate
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from experience import zstd
from experience.dedup.canonical import outcome_of
from experience.distill.digest import DIGEST_VERSION, RunDigest, instruction_hash
from experience.distill.selection import exclusion_reason
from experience.distill.source import SourceRun
from experience.distill.spec import DatasetSpec
from experience.errors import ValidationError
from experience.models import Blob, Label, Step, Trajectory, TrajectoryDigest
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services.step_labels import HUMAN, labelled_runs_excluded
from experience.steps import (
    CONTEXT,
    ContextMessages,
    contexts_as_deltas,
    is_context_delta,
    json_loads,
    referenced_hashes,
    step_record_from_parts,
)

LIST_FILTERS = ("task_sets", "task_keys", "models", "harnesses", "sources", "curation", "tags")
DATE_FILTERS = ("created_after", "created_before")
OUTCOMES = ("success", "failure")
FILTER_KEYS = (*LIST_FILTERS, *DATE_FILTERS, "outcome")
# Batch bounds of the read path: a batch is this many runs, or fewer once their steps reach STEP_BATCH.
RUN_BATCH = 500
STEP_BATCH = 5000
BLOB_QUERY = 5000  # hashes per blob query
SQLITE_BLOB_QUERY = 500  # SQLite caps the parameters of one statement
PROGRESS_EVERY_S = 2.0
PREFETCH = True  # fetch the next batch on a second connection while this one is rebuilt (see _Fetcher)

TRAJECTORY_COLUMNS = (
    "id", "source", "source_format", "source_version", "source_ref", "task_set", "task_key", "instruction",
    "harness", "model", "status", "reward", "success", "started_at", "finished_at", "cost", "final_diff",
    "metadata", "n_steps", "curation_status", "is_duplicate", "tags",
    "canonical_id", "canonical__success", "canonical__reward",  # the run a duplicate is marked against
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
# The hashes as one comma-separated text parameter: psycopg dumps a list element by element, in Python.
_BLOBS_SQL = (
    f"SELECT sha256, encoding, data FROM {Blob._meta.db_table} WHERE sha256 = ANY(string_to_array(%s, ','))"
)
# A step row's columns after its ids (`_STEPS_SQL`), as the run's content hash reads them: str() of each.
_STEP_TEXT = "\t".join(["%s"] * (len(STEP_COLUMNS) - 2))
# Record fields that come straight from a trajectory column of the same name.
_RECORD_COLUMNS = (
    "source", "source_format", "source_version", "source_ref", "task_set", "task_key", "instruction",
    "harness", "model", "status", "reward", "success", "started_at", "finished_at", "cost", "final_diff",
    "metadata",
)  # fmt: skip


# --- filters -------------------------------------------------------------------------------------------


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
    # A run a curator labelled reward-hack (an excluding step label) is never training data, whatever the spec.
    return labelled_runs_excluded(Trajectory.objects.filter(query))


def _tags_match(tags: Any, wanted: list[str]) -> bool:
    """The tag filter in Python, for SQLite (the embedded default), which has no JSON containment."""
    return isinstance(tags, list) and set(wanted) <= set(tags)


# --- the read path -------------------------------------------------------------------------------------


class Progress:
    """Counts what the read path has read; calls `show(runs, steps)` at most every PROGRESS_EVERY_S."""

    def __init__(self, show: Callable[[int, int], None] | None = None) -> None:
        self.show = show
        self.runs = 0
        self.steps = 0
        self._shown = 0.0

    def add(self, *, runs: int, steps: int) -> None:
        self.runs += runs
        self.steps += steps
        now = time.monotonic()
        if self.show is not None and now - self._shown >= PROGRESS_EVERY_S:
            self._shown = now
            self.show(self.runs, self.steps)


def source_runs(spec: DatasetSpec) -> Iterator[SourceRun]:
    """The runs the spec's filters select, ordered by (task key, id), as SourceRuns, streamed.

    Runs the spec will leave out come without their steps (nothing downstream reads them).
    """
    for batch in source_run_batches(spec):
        yield from batch


def source_run_batches(
    spec: DatasetSpec,
    *,
    progress: Progress | None = None,
    share: tuple[int, int] | None = None,
    digests: bool = False,
) -> Iterator[list[StoredRun]]:
    """`source_runs` a batch at a time: at most RUN_BATCH runs or about STEP_BATCH steps. `digests`: runs
    with a kept digest (`TrajectoryDigest`, valid for the run as it is now) come as that digest, without
    their steps (`StoredRun.digest`); for builds that keep them (`digests_kept`).

    `share` (k, n), on Postgres: only the runs of the tasks that fall to share k of n (by the first byte of
    the task key's sha256, modulo n), for one of n readers building side by side: a task's runs all fall
    to one share (pairs and balancing are made within a task), and the shares are disjoint whatever each
    reader's snapshot of the store."""
    wanted_tags = spec.filters.get("tags") if connection.vendor != "postgresql" else None
    keep = (lambda row: _tags_match(row["tags"], wanted_tags)) if wanted_tags else None
    runs = runs_matching(spec.filters)
    if share is not None:
        runs = runs.alias(task_share=RawSQL(_TASK_SHARE_SQL, [share[1]])).filter(task_share=share[0])
    return stored_run_batches(runs, spec, progress=progress, keep=keep, digests=digests)


_TASK_SHARE_SQL = f"mod(get_byte(sha256(convert_to({Trajectory._meta.db_table}.task_key, 'UTF8')), 0), %s)"


def _store_ordering() -> tuple[Any, str]:
    """The order runs are read in: by task key, then id. On Postgres the task key is sorted in the "C"
    collation (by code point, as Python compares strings and SQLite does by default), not the database's,
    so the order (and so the files) do not depend on the database's locale."""
    if connection.vendor == "postgresql":
        return Collate("task_key", "C"), "id"
    return "task_key", "id"


def stored_run_batches(
    trajectories: QuerySet[Trajectory],
    spec: DatasetSpec,
    *,
    progress: Progress | None = None,
    keep: Callable[[dict[str, Any]], bool] | None = None,
    digests: bool = False,
) -> Iterator[list[StoredRun]]:
    """The trajectories as StoredRuns ordered by (task key, id), in batches; only the runs the spec
    uses get their steps. `keep`: a test on each trajectory row (TRAJECTORY_COLUMNS) made in Python,
    before any step is read, for what SQL here does not say. `digests`: as `source_run_batches`."""
    progress = progress or Progress()
    columns = trajectories.order_by(*_store_ordering()).values_list(*TRAJECTORY_COLUMNS)
    # A server-side cursor: trajectory rows arrive RUN_BATCH at a time, never all at once.
    rows: Iterable[dict[str, Any]] = (
        dict(zip(TRAJECTORY_COLUMNS, values, strict=True))
        for values in columns.iterator(chunk_size=RUN_BATCH)
    )
    if keep is not None:
        rows = filter(keep, rows)
    with _Fetcher() as fetcher:
        # One batch ahead: the next batch's steps and blobs are fetched while this one is rebuilt.
        pending: tuple[list[dict[str, Any]], list[StoredRun], Future[_Fetched]] | None = None
        for batch in _batches(rows):
            _attach_step_labels(batch)
            bare = [_stored_run(row, None) for row in batch]
            needed = [run.row_id for run in bare if exclusion_reason(run, spec) is None]
            instructions = {row["id"]: row["instruction"] for row in batch} if digests else None
            fetched = fetcher.fetch(needed, instructions)
            if pending is not None:
                yield _finished(*pending, progress)
            pending = (batch, bare, fetched)
        if pending is not None:
            yield _finished(*pending, progress)


def _attach_step_labels(batch: list[dict[str, Any]]) -> None:
    """Put each run's curator step labels and rubric verdicts on its row (two queries per batch), for its
    dataset rows."""
    found: dict[int, list[tuple[int, str, str]]] = {}
    labels = (Label.objects.filter(trajectory_id__in=[row["id"] for row in batch], source=HUMAN, step__isnull=False)
              .values_list("trajectory_id", "step__seq", "name", "value").order_by("trajectory_id", "step__seq", "name"))
    for trajectory_id, seq, name, value in labels:
        found.setdefault(trajectory_id, []).append((seq, name, str((value or {}).get("note", ""))))
    overrides: dict[int, list[tuple[str, bool]]] = {}
    verdicts = (Label.objects.filter(trajectory_id__in=[row["id"] for row in batch], source=HUMAN, step__isnull=True)
                .values_list("trajectory_id", "name", "value").order_by("trajectory_id", "name"))
    for trajectory_id, name, value in verdicts:
        if isinstance(value, dict) and "override" in value:
            overrides.setdefault(trajectory_id, []).append((name, bool(value["override"])))
    for row in batch:
        row["step_labels"] = tuple(found.get(row["id"], ()))
        row["rubric_overrides"] = tuple(overrides.get(row["id"], ()))


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


def _finished(
    batch: list[dict[str, Any]], bare: list[StoredRun], fetched: Future[_Fetched], progress: Progress
) -> list[StoredRun]:
    """A batch's runs: those the spec uses with their steps or their stored digest, the others as they
    were."""
    done = fetched.result()
    steps_of = _steps_of(done)
    runs = []
    for row, run in zip(batch, bare, strict=True):
        if row["id"] in steps_of:
            run = _stored_run(row, steps_of[row["id"]])
        elif row["id"] in done.digests:
            run = _digested_run(row, done.digests[row["id"]])
        runs.append(run)
    progress.add(runs=len(batch), steps=sum(run.steps_read for run in runs))
    return runs


class _Fetched(NamedTuple):
    trajectory_ids: list[int]  # the runs read with their steps
    rows: list[tuple]  # `_step_rows`
    refs: list[dict[str, Any]]  # each row's blob_refs, parsed
    contexts: dict[int, list[str] | dict[str, Any]]  # `contexts_as_deltas`: by step id
    blobs: dict[str, bytes]
    digests: dict[int, _KeptDigest]  # the runs read as their stored digest instead


def _fetch(trajectory_ids: list[int], instructions: Mapping[int, str] | None = None) -> _Fetched:
    """The database half of a batch: the runs' stored digests (with `instructions`, each run's, when the
    build can use digests), then the step rows of the others and the blobs they refer to, in one query
    each."""
    digests = (
        _kept_digests(trajectory_ids, instructions) if instructions is not None and trajectory_ids else {}
    )
    trajectory_ids = [trajectory_id for trajectory_id in trajectory_ids if trajectory_id not in digests]
    if not trajectory_ids:
        return _Fetched([], [], [], {}, {}, digests)
    rows = _step_rows(trajectory_ids)
    refs = _refs_parsed([row[13] for row in rows])
    contexts = contexts_as_deltas([row[0] for row in rows], refs)  # whole runs: every base is here
    hashes: set[str] = set()
    for step_refs in refs:
        hashes.update(referenced_hashes(step_refs, context=False))
    for context in contexts.values():
        hashes.update(context["append"] if is_context_delta(context) else context)
    return _Fetched(trajectory_ids, rows, refs, contexts, _blobs(hashes), digests)


def _refs_parsed(texts: list[str]) -> list[dict[str, Any]]:
    """Rows' blob_refs texts (whole runs, in order) parsed. Refs that only hold a context as a full list,
    whose text is the previous such refs' text with digests added (a run's context grows a message or two
    a call: in a store of full lists, most of the text read), are parsed for what they add: the same
    lists, each digest parsed once."""
    parsed: list[dict[str, Any]] = []
    head, last = "", None  # the text before the closing `]}` of the last refs holding only a full list
    for text in texts:
        refs = _extended(text, head, last) if last is not None else None
        if refs is None:
            refs = json_loads(text)
        context = refs.get(CONTEXT)
        if len(refs) == 1 and type(context) is list and text.endswith("]}"):
            head, last = text[:-2], context
        parsed.append(refs)
    return parsed


def _extended(text: str, head: str, last: list[str]) -> dict[str, Any] | None:
    """`{CONTEXT: last + added}` when `text` is `head` (`{"request_messages": [...last`), a comma, the
    added digests and `]}`; else None. Whatever is added must parse, and alone, as the rest of the list."""
    if not (text.startswith(head) and text.endswith("]}") and text[len(head) : len(head) + 1] == ","):
        return None
    try:
        added = json_loads("[" + text[len(head) + 1 : -2] + "]")
    except ValueError:
        return None
    return {CONTEXT: last + added} if added else None


class _Fetcher:
    """Runs `_fetch` on a thread of its own with its own database connection, so Postgres works on the
    next batch while Python rebuilds this one (two processes, two cores). Only outside a transaction on
    Postgres: a second connection cannot see what this one has not committed, and in autocommit it sees
    what the main connection sees. Otherwise (in a transaction, on SQLite, or PREFETCH off) it fetches
    in line. The thread's connection is closed when the fetcher is."""

    def __init__(self) -> None:
        threaded = PREFETCH and connection.vendor == "postgresql" and not connection.in_atomic_block
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataset-fetch") if threaded else None
        )

    def fetch(self, trajectory_ids: list[int], instructions: Mapping[int, str] | None) -> Future[_Fetched]:
        if self._pool is not None:
            return self._pool.submit(_fetch, trajectory_ids, instructions)
        done: Future[_Fetched] = Future()
        done.set_result(_fetch(trajectory_ids, instructions))
        return done

    def __enter__(self) -> _Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            # `connection` is looked up on the fetch thread, so this closes that thread's own connection.
            closed = self._pool.submit(lambda: connection.close())
            self._pool.shutdown(wait=True)
            closed.result()


class _RunSteps(NamedTuple):
    """A run's steps in seq order, as three aligned lists."""

    ids: list[int]
    records: list[StepRecord]
    texts: list[str]  # each row's columns as Postgres renders them: what the run's content hash reads


def _steps_of(fetched: _Fetched) -> dict[int, _RunSteps]:
    """The fetched runs' steps, rebuilt as StepRecords, per run."""
    contexts = ContextMessages(fetched.blobs).contexts(fetched.contexts)
    grouped = {trajectory_id: _RunSteps([], [], []) for trajectory_id in fetched.trajectory_ids}
    for row, refs in zip(fetched.rows, fetched.refs, strict=True):
        steps = grouped[row[1]]
        steps.ids.append(row[0])
        steps.records.append(_step_record(row, refs, fetched.blobs, contexts.get(row[0])))
        steps.texts.append(_STEP_TEXT % row[2:])
    return grouped


def _step_rows(trajectory_ids: list[int]) -> list[tuple]:
    """The runs' step rows (STEP_COLUMNS; timestamps and JSON as text), ordered by (run, seq).

    On Postgres, raw SQL because this is the hot path: one `= ANY(array)` parameter instead of thousands
    of IN placeholders, and jsonb and timestamps fetched as Postgres's text (canonical for jsonb), which the
    content hash reads as it is. Elsewhere (SQLite, the embedded default) the ORM, rendering the same text.
    """
    if connection.vendor == "postgresql":
        with _binary_cursor() as cursor:
            cursor.execute(_STEPS_SQL, [trajectory_ids], binary=True, prepare=False)
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
    """Blob contents by hash, BLOB_QUERY distinct hashes a query (`= ANY(array)` on Postgres)."""
    wanted = list(set(hashes))
    found: dict[str, bytes] = {}
    postgres = connection.vendor == "postgresql"
    size = BLOB_QUERY if postgres else SQLITE_BLOB_QUERY
    for start in range(0, len(wanted), size):
        chunk = wanted[start : start + size]
        rows: Iterable[tuple[Any, ...]]
        if postgres:
            with _binary_cursor() as cursor:
                cursor.execute(_BLOBS_SQL, [",".join(chunk)], binary=True, prepare=False)
                rows = cursor.fetchall()
        else:
            rows = Blob.objects.filter(sha256__in=chunk).values_list("sha256", "encoding", "data")
        found.update((digest, _decoded(encoding, data)) for digest, encoding, data in rows)
    return found


@contextmanager
def _binary_cursor() -> Iterator[psycopg.Cursor]:
    """psycopg's own cursor on this thread's connection: Django's is a client-side cursor, which quotes
    parameters into the statement and cannot fetch in binary (bytea as its bytes rather than as hex text,
    numbers unparsed). Text columns come back as the same str either way. Statements are run with
    `prepare=False`: this cursor binds on the server, where psycopg would otherwise prepare a statement
    run five times, which a transaction-pooling proxy (PgBouncer) may not keep."""
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        yield cursor


def _decoded(encoding: str, data: bytes | memoryview) -> bytes:
    raw = bytes(data)
    return zstd.decompress(raw) if encoding == "zstd" else raw


def _step_record(
    row: tuple, refs: dict[str, Any], blobs: dict[str, bytes], context: list[MessageRecord] | None
) -> StepRecord:
    """A StepRecord from a `_STEPS_SQL` row and its context as the batch rebuilt it (`_steps_of`); the payload,
    fresh from the parser, is the record's own."""
    return step_record_from_parts(
        kind=row[3], payload=json_loads(row[12]), blob_refs=refs, blobs=blobs, context=context, own_payload=True,
        started_at=_moment(row[4]), ended_at=_moment(row[5]), duration_ms=row[6], tokens_in=row[7],
        tokens_out=row[8], exit_code=row[9], is_error=row[10], call_id=row[11],
    )  # fmt: skip


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


@dataclass(frozen=True)
class StoredRun(SourceRun):
    """A SourceRun read from the store: its row id and its step rows' ids (aligned with the record's
    steps), so labels and value estimates can be written back."""

    row_id: int = 0
    step_ids: tuple[int, ...] = ()
    steps_sha256: str = ""  # `steps_content_hash` of its steps, when they (or its digest) were read
    # Read from its stored digest instead of its steps: how many steps it has, and its rubric's label
    # changes as (name, value, step id).
    digest_steps: int = 0
    digest_labels: tuple[tuple[str, bool, int | None], ...] | None = None

    @property
    def steps_read(self) -> int:
        """The steps the build read of this run, as steps or as its digest."""
        return len(self.record.steps) or self.digest_steps


def _stored_run(row: Mapping[str, Any], steps: _RunSteps | None) -> StoredRun:
    """`steps` None: a run the spec leaves out, passed on without steps (and without a content hash)."""
    record = TrajectoryRecord(
        **{name: row[name] for name in _RECORD_COLUMNS}, steps=steps.records if steps is not None else []
    )
    steps_hash = steps_content_hash(steps.texts) if steps is not None else ""
    return StoredRun(
        trajectory_id=str(row["id"]),
        record=record,
        content_hash=store_content_hash(row, steps_hash) if steps is not None else "",
        curation=row["curation_status"],
        is_duplicate=row["is_duplicate"],
        duplicate_outcome_differs=_duplicate_outcome_differs(row),
        step_labels=row.get("step_labels", ()),
        rubric_overrides=row.get("rubric_overrides", ()),
        row_id=row["id"],
        step_ids=tuple(steps.ids) if steps is not None else (),
        steps_sha256=steps_hash,
    )


def _digested_run(row: Mapping[str, Any], kept: _KeptDigest) -> StoredRun:
    """A run read as its stored digest: no steps, the same content hash as if they had been read."""
    return StoredRun(
        trajectory_id=str(row["id"]),
        record=TrajectoryRecord(**{name: row[name] for name in _RECORD_COLUMNS}, steps=[]),
        content_hash=store_content_hash(row, kept.steps_sha256),
        curation=row["curation_status"],
        is_duplicate=row["is_duplicate"],
        duplicate_outcome_differs=_duplicate_outcome_differs(row),
        digest=RunDigest.decode(kept.data),
        step_labels=row.get("step_labels", ()),
        rubric_overrides=row.get("rubric_overrides", ()),
        row_id=row["id"],
        steps_sha256=kept.steps_sha256,
        digest_steps=kept.n_steps,
        digest_labels=tuple((name, value, step) for name, value, step in kept.labels),
    )


def _duplicate_outcome_differs(row: Mapping[str, Any]) -> bool:
    """A duplicate mark against no run, or against a run whose outcome differs: it leaves nothing out (the
    Python twin of `experience.services.dedup.same_outcome_duplicates`)."""
    if not row["is_duplicate"]:
        return False
    if row["canonical_id"] is None:
        return True
    mine = outcome_of(success=row["success"], reward=row["reward"])
    return mine != outcome_of(success=row["canonical__success"], reward=row["canonical__reward"])


def steps_content_hash(step_texts: list[str]) -> str:
    """sha256 of a run's step rows as Postgres renders them (blobs by their hashes, which name their
    content), one per line: what a run's content hash reads of its steps, kept with its digest."""
    return hashlib.sha256("\n".join(step_texts).encode("utf-8", "surrogatepass")).hexdigest()


def store_content_hash(row: Mapping[str, Any], steps_sha256: str) -> str:
    """sha256 of a run as stored: its record columns and its steps' hash (`steps_content_hash`). Cheaper
    than hashing the rebuilt record (a context shared by 50 calls is 50 short references, not 50 copies),
    and it changes with any change to the run."""
    digest = hashlib.sha256()
    head = {name: row[name] for name in _RECORD_COLUMNS}
    digest.update(json.dumps(head, sort_keys=True, default=str).encode("utf-8", "surrogatepass"))
    digest.update(b"\n" + steps_sha256.encode("ascii"))
    return digest.hexdigest()


# --- stored digests ------------------------------------------------------------------------------------


class _KeptDigest(NamedTuple):
    steps_sha256: str
    n_steps: int
    labels: list[list[Any]]
    data: bytes


_DIGESTS_SQL = (
    f"SELECT trajectory_id, instruction_sha256, steps_sha256, n_steps, labels::text, data "
    f"FROM {TrajectoryDigest._meta.db_table} WHERE trajectory_id = ANY(%s) AND version = %s AND error = ''"
)
# The digests' bytes go as a binary parameter (`%b`): as text, psycopg writes each byte as hex digits in an
# array literal that Postgres parses back, most of the statement's time for a batch's megabytes of digests.
_DIGEST_UPSERT = f"""
INSERT INTO {TrajectoryDigest._meta.db_table} AS kept
    (trajectory_id, version, instruction_sha256, steps_sha256, n_steps, labels, data, error, created_at)
SELECT d.trajectory_id, %s, d.instruction_sha256, d.steps_sha256, d.n_steps, d.labels::jsonb, d.data, '', now()
FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::int[], %s::text[], %b::bytea[])
    AS d(trajectory_id, instruction_sha256, steps_sha256, n_steps, labels, data)
WHERE (SELECT count(*) FROM {Step._meta.db_table} s WHERE s.trajectory_id = d.trajectory_id) = d.n_steps
ON CONFLICT (trajectory_id) DO UPDATE SET version = excluded.version,
    instruction_sha256 = excluded.instruction_sha256, steps_sha256 = excluded.steps_sha256,
    n_steps = excluded.n_steps, labels = excluded.labels, data = excluded.data, error = '',
    created_at = excluded.created_at
"""


def digests_kept(spec: DatasetSpec) -> bool:
    """Whether a build of the spec reads and keeps run digests: value sets, on Postgres (where triggers
    drop a digest whose steps change: migration 0007)."""
    return spec.kind == "value" and connection.vendor == "postgresql"


def _kept_digests(trajectory_ids: list[int], instructions: Mapping[int, str]) -> dict[int, _KeptDigest]:
    """The stored digests of these runs that are of this version and were derived with the run's
    instruction as it is now."""
    with _binary_cursor() as cursor:
        cursor.execute(_DIGESTS_SQL, [trajectory_ids, DIGEST_VERSION], binary=True, prepare=False)
        rows = cursor.fetchall()
    return {
        trajectory_id: _KeptDigest(steps_sha, n_steps, json_loads(labels), bytes(data))
        for trajectory_id, instruction_sha, steps_sha, n_steps, labels, data in rows
        if instruction_sha == instruction_hash(instructions[trajectory_id])
    }


def digest_failures_write(failures: Mapping[int, str]) -> None:
    """Record that these runs' digests could not be derived (by id: the error): a digest row of this
    version with the error and no data, which builds do not read (they derive the digest again, and meet
    the error themselves) and which takes the run off the pending list until its steps change."""
    for trajectory_id, error in failures.items():
        TrajectoryDigest.objects.update_or_create(
            trajectory_id=trajectory_id,
            defaults={"version": DIGEST_VERSION, "instruction_sha256": "", "steps_sha256": "", "n_steps": 0,
                      "labels": [], "data": b"", "error": error[:2000]},
        )  # fmt: skip


def digests_write(runs: Iterable[StoredRun], labels: Mapping[int, list[tuple[str, bool, int | None]]]) -> int:
    """Keep the digests of runs read with their steps (`labels`: each one's label changes, with step ids).
    A run whose step count has changed since it was read is skipped (its digest would be stale at once).
    Returns how many were given."""
    batch = [
        (run, run.digest) for run in runs if run.digest is not None and run.record.steps and run.steps_sha256
    ]
    if not batch:
        return 0
    columns = (
        [run.row_id for run, _ in batch],
        [instruction_hash(run.record.instruction) for run, _ in batch],
        [run.steps_sha256 for run, _ in batch],
        [len(run.record.steps) for run, _ in batch],
        [json.dumps([list(change) for change in labels[run.row_id]]) for run, _ in batch],
        [digest.encode() for _, digest in batch],
    )
    with _binary_cursor() as cursor:
        cursor.execute(_DIGEST_UPSERT, [DIGEST_VERSION, *columns], prepare=False)
    return len(batch)
