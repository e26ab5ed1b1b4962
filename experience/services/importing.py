"""Importing trajectory files (any format experience.importers reads) into the store.

Per file, all or nothing: the file's runs are written in one transaction (a savepoint, when the files of a
directory share a commit: FILES_PER_COMMIT of them, so a directory of small files, a session or a trial each,
does not pay a commit's flush per file), so a fault anywhere in it (a truncated last line, a run missing a
field, a run over the store's limits) leaves nothing of that file behind, and the report says what was wrong
and where. Small files of a directory (SMALL_FILE_BYTES) are each read and parsed on their own, then written
together, a group at a time (_import_small): one blob write, one lookup, one ingest call instead of about 20
round trips a file; if that write fails, or a file depends on an earlier one of its group, the group is
imported file by file, so the outcome is always the one-by-one outcome. The original file is kept as a blob
(Trajectory.original_blob on every run read from it), and its format and version are recorded on each run.
Every run imported has source `import`: a file cannot claim a run was a Trove rollout (a Trove export of
rollouts keeps the claim in metadata["claimed_source"], see experience.services.provenance).

Idempotent: a file whose bytes were imported before is reported as present without being parsed again, and
within a file every run already stored (same source and source_ref) is skipped, so importing the same file
again adds nothing.

By content too (experience.importers.fingerprint, kept in metadata["content_fingerprint"]):
- a new run whose content is already stored under another ref (the same file moved, renamed, or
  re-serialised, say JSONL turned into a JSON array) is not written: the report lists it as a duplicate
  of the stored run;
- a run whose ref is stored but whose content or outcome differs (the file changed since) is reported as
  changed, with what differs, and not written; with `replace=True` it is imported anew and the old run is
  kept as history: its ref gets the suffix "~replaced-<id>", it is tagged "replaced", the two are linked
  (metadata["replaced_by"] / ["replaces"]) and each gets a CurationEvent (import_replaced / import_replaces).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Q

from experience.errors import TroveError
from experience.importers import REGISTRY, detect_format, harbor, iter_records, reports, unsupported
from experience.importers.errors import ImportFormatError
from experience.importers.fingerprint import FINGERPRINT_KEY, fingerprint
from experience.models import CurationEvent, Trajectory
from experience.records import TrajectoryRecord
from experience.services.blobs import blobs_store
from experience.services.ingest import trajectories_ingest_many
from experience.services.outcome_labels import trajectories_label_from_report
from experience.services.provenance import as_import

BATCH = 200  # runs per ingest call: bounds memory on a file of 10,000 runs
FILES_PER_COMMIT = 50  # files of a directory imported under one commit (each still all or nothing)
SMALL_FILE_BYTES = 1 << 20  # files up to this size are read whole and written with the others of their group
ORIGINAL_MAX_BYTES = 256 * 1024 * 1024  # larger files are imported without keeping the original

IMPORTED, PRESENT, INVALID, UNRECOGNISED = "imported", "present", "invalid", "unrecognised"
CHANGED, DUPLICATE, REPORT = "changed", "duplicate", "report"
REPLACED_TAG = "replaced"


@dataclass
class FileReport:
    """What importing one file did. `status`: imported (at least one new run), changed (no new run, and some
    stored run's content differs from the file's: see `changed`), duplicate (its runs are stored under other
    refs: see `duplicates`), present (every run was already stored), invalid (nothing written; `error` says
    why), unrecognised (not a trajectory file), report (an evaluation report: `labels` says which runs of the
    import it labelled, see reports_apply). `replaced` counts runs re-imported with replace=True."""

    path: str
    status: str = ""
    format: str = ""
    imported: int = 0
    present: int = 0
    error: str = ""
    trajectory_ids: list[int] = field(default_factory=list)
    original_kept: bool = True
    changed: list[dict] = field(default_factory=list)  # {source_ref, trajectory_id, differs}
    duplicates: list[dict] = field(default_factory=list)  # {source_ref, duplicate_of}
    replaced: int = 0
    labels: dict = field(default_factory=dict)  # for a report: LabelReport.as_dict()

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in (
            "path", "status", "format", "imported", "present", "error", "trajectory_ids", "original_kept",
            "changed", "duplicates", "replaced", "labels")}

    def settle(self) -> None:
        """The status of a file whose runs were read without fault."""
        self.status = (IMPORTED if self.imported else CHANGED if self.changed
                       else DUPLICATE if self.duplicates and not self.present else PRESENT)


@dataclass
class ImportReport:
    files: list[FileReport] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    @property
    def imported(self) -> int:
        return sum(f.imported for f in self.files)

    @property
    def present(self) -> int:
        return sum(f.present for f in self.files)

    @property
    def failed(self) -> list[FileReport]:
        return [f for f in self.files if f.status in (INVALID, UNRECOGNISED)]

    @property
    def changed(self) -> int:
        return sum(len(f.changed) for f in self.files)

    @property
    def duplicates(self) -> int:
        return sum(len(f.duplicates) for f in self.files)

    def as_dict(self) -> dict:
        return {
            "imported": self.imported,
            "present": self.present,
            "changed": self.changed,
            "duplicates": self.duplicates,
            "replaced": sum(f.replaced for f in self.files),
            "files_imported": self.count(IMPORTED),
            "files_present": self.count(PRESENT),
            "files_invalid": self.count(INVALID),
            "files_unrecognised": self.count(UNRECOGNISED),
            "files": [f.as_dict() for f in self.files],
        }


def trajectories_import_file(
    *,
    path: str | Path,
    format: str | None = None,
    name: str | None = None,
    label: str | None = None,
    on_runs: Callable[[int], None] | None = None,
    success_threshold: float | None = None,
    replace: bool = False,
) -> FileReport:
    """Import every run of one file, or none of them. Never raises for a bad file: the report says why.

    `format` forces a format (a registry key of experience.importers) instead of detecting it; `name` is the
    file's name inside each run's source_ref (see experience.importers); `label` how the report names the
    file (default: the path); `on_runs(n)` is called as runs are stored, for progress bars;
    `success_threshold` the reward at or above which a run without a verdict succeeded (see
    experience.importers.outcomes: without it only 0/1 rewards decide); `replace` re-imports runs whose
    content changed, keeping the old ones as history (module docstring).
    """
    path = Path(path)
    report = FileReport(path=label or str(path))
    try:
        report.format = _format_of(path, format)
    except ImportFormatError as error:
        kind = reports.detect(path) if format is None else None
        if kind:  # labels runs once the whole import is stored: reports_apply
            report.status, report.format = REPORT, kind
        else:
            report.status, report.error = UNRECOGNISED, error.message
        return report
    digest, original = _original(path)
    report.original_kept = original is not None
    earlier = list(Trajectory.objects.filter(original_blob=digest).order_by("id").values_list("id", flat=True))
    if earlier:  # the same bytes were imported before: nothing in them is new
        report.status, report.present, report.trajectory_ids = PRESENT, len(earlier), earlier
        return report
    try:
        _import_runs(path, report, name=name, digest=digest, original=original, on_runs=on_runs,
                     success_threshold=success_threshold, replace=replace)
    except TroveError as error:
        report.status, report.error, report.imported, report.present = INVALID, error.message, 0, 0
        report.trajectory_ids, report.changed, report.duplicates, report.replaced = [], [], [], 0
        return report
    report.settle()
    return report


def _format_of(path: Path, forced: str | None) -> str:
    if forced is None:
        return detect_format(path)
    if forced not in REGISTRY:
        raise ImportFormatError(path, f"unknown format {forced!r}; known: {', '.join(REGISTRY)}")
    return forced


def _original(path: Path) -> tuple[str, bytes | None]:
    """The file's sha256, and its bytes when small enough to keep."""
    if path.stat().st_size > ORIGINAL_MAX_BYTES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest(), None
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), data


def _import_runs(
    path: Path, report: FileReport, *, name: str | None, digest: str, original: bytes | None,
    on_runs: Callable[[int], None] | None, success_threshold: float | None = None, replace: bool = False,
) -> None:
    # One transaction for the whole file: iter_records raises late for a fault late in the file (its
    # contract), and that error must take the runs already written with it.
    with transaction.atomic():
        if original is not None:
            blobs_store({digest: original})
        index = 0
        # Every run read from a file is an import, whatever the file claims (provenance.as_import).
        records = map(_fingerprinted, map(as_import, iter_records(path, report.format, name=name,
                                                                  success_threshold=success_threshold)))
        for batch in _batches(records):
            fresh, retired = _sort_batch(batch, report, replace=replace, file=report.path)
            outcomes = trajectories_ingest_many(
                records=fresh, original_blob=digest if original is not None else "",
                field_prefix="record {index}: ", index_offset=index,
            ) if fresh else []
            index += len(batch)
            for outcome in outcomes:
                report.trajectory_ids.append(outcome.trajectory_id)
                if outcome.created:
                    report.imported += 1
                else:
                    report.present += 1
            _link_replacements(retired, {o.source_ref: o.trajectory_id for o in outcomes}, file=report.path)
            report.replaced += len(retired)
            if on_runs:
                on_runs(len(batch))


def _fingerprinted(record: TrajectoryRecord) -> TrajectoryRecord:
    record.metadata = {**record.metadata, FINGERPRINT_KEY: fingerprint(record)}
    return record


@dataclass
class _Stored:
    id: int
    source_ref: str
    task_key: str
    fingerprint: str | None
    reward: float | None
    success: bool | None
    n_steps: int


def _sort_batch(
    batch: list[TrajectoryRecord], report: FileReport, *, replace: bool, file: str,
    stored: tuple[dict[str, _Stored], dict[str, _Stored]] | None = None,
) -> tuple[list[TrajectoryRecord], list[_Stored]]:
    """The records to write, and the stored runs they replace. Records already stored unchanged stay in the
    list (ingest counts them as present); changed ones are reported (or their old run retired, with
    `replace`); duplicates by content are reported and left out. `stored`: _stored_for(batch), when the
    caller looked it up already."""
    by_ref, by_content = stored if stored is not None else _stored_for(batch)
    fresh: list[TrajectoryRecord] = []
    retired: list[_Stored] = []
    for record in batch:
        known = by_ref.get(record.source_ref)
        if known is None:
            twin = by_content.get(record.metadata[FINGERPRINT_KEY])
            if twin is not None:
                report.duplicates.append({"source_ref": record.source_ref, "duplicate_of": twin.id,
                                          "stored_ref": twin.source_ref})
                continue
        elif differs := _differences(known, record):
            if not replace:
                report.changed.append({"source_ref": record.source_ref, "trajectory_id": known.id,
                                       "differs": differs})
                continue
            _retire(known, reason=f"re-imported from {file} with replace: {differs}")
            retired.append(known)
        fresh.append(record)
    return fresh, retired


def _stored_rows(batch: list[TrajectoryRecord]) -> list[_Stored]:
    """The stored imports that share a ref with the batch's records or a content fingerprint (oldest first), in
    one query. The task key (indexed) narrows the content search: the fingerprint covers it, so a twin has the
    same task key."""
    refs = {r.source_ref for r in batch}
    same_content = Q(task_key__in={r.task_key for r in batch},
                     **{f"metadata__{FINGERPRINT_KEY}__in": {r.metadata[FINGERPRINT_KEY] for r in batch}})
    rows = Trajectory.objects.filter(Q(source_ref__in=refs) | same_content, source="import").order_by("id")
    fields = ("id", "source_ref", "task_key", f"metadata__{FINGERPRINT_KEY}", "reward", "success", "n_steps")
    return [_Stored(*row) for row in rows.values_list(*fields)]


def _split_stored(
    rows: list[_Stored], batch: list[TrajectoryRecord]
) -> tuple[dict[str, _Stored], dict[str, _Stored]]:
    """Of `rows` (_stored_rows of these records or more), those that share a ref with the batch's records (by
    ref), and those that share a task key and a content fingerprint (by fingerprint: the oldest current run,
    else the oldest replaced one)."""
    refs = {r.source_ref for r in batch}
    task_keys = {r.task_key for r in batch}
    fingerprints = {r.metadata[FINGERPRINT_KEY] for r in batch}
    by_ref: dict[str, _Stored] = {}
    by_content: dict[str, _Stored] = {}
    for stored in rows:
        if stored.source_ref in refs:
            by_ref[stored.source_ref] = stored
        elif stored.task_key in task_keys and stored.fingerprint in fingerprints:
            twin = by_content.get(stored.fingerprint or "")
            # A relabelled run replaced with --replace keeps its fingerprint: name the version in use, not history.
            if twin is None or (_retired(twin) and not _retired(stored)):
                by_content[stored.fingerprint or ""] = stored
    return by_ref, by_content


def _retired(stored: _Stored) -> bool:
    return stored.source_ref.endswith(f"~replaced-{stored.id}")  # the ref _retire gave it


def _stored_for(batch: list[TrajectoryRecord]) -> tuple[dict[str, _Stored], dict[str, _Stored]]:
    return _split_stored(_stored_rows(batch), batch)


def _differences(stored: _Stored, record: TrajectoryRecord) -> str:
    """What differs between a stored run and the file's version of it, or "" when nothing does."""
    differs = []
    if stored.n_steps != len(record.steps):
        differs.append(f"steps {stored.n_steps} -> {len(record.steps)}")
    elif stored.fingerprint is not None and stored.fingerprint != record.metadata[FINGERPRINT_KEY]:
        differs.append("step content")
    if stored.reward != record.reward:
        differs.append(f"reward {stored.reward} -> {record.reward}")
    if stored.success != record.success:
        differs.append(f"success {stored.success} -> {record.success}")
    return ", ".join(differs)


def _retire(stored: _Stored, *, reason: str) -> None:
    """Move a replaced run out of its ref (kept, tagged) so the new version can take it."""
    old_ref = f"{stored.source_ref}~replaced-{stored.id}"
    Trajectory.objects.filter(pk=stored.id).update(source_ref=old_ref[-512:])
    trajectory = Trajectory.objects.get(pk=stored.id)
    trajectory.tags = [*trajectory.tags, REPLACED_TAG] if REPLACED_TAG not in trajectory.tags else trajectory.tags
    trajectory.save(update_fields=["tags", "updated_at"])
    CurationEvent.objects.create(trajectory_id=stored.id, action="import_replaced", reason=reason,
                                 before={"source_ref": stored.source_ref}, after={"source_ref": old_ref[-512:]})


def _link_replacements(retired: list[_Stored], new_ids: dict[str, int], *, file: str) -> None:
    for stored in retired:
        new_id = new_ids[stored.source_ref]
        old = Trajectory.objects.get(pk=stored.id)
        old.metadata = {**old.metadata, "replaced_by": new_id}
        old.save(update_fields=["metadata", "updated_at"])
        new = Trajectory.objects.get(pk=new_id)
        new.metadata = {**new.metadata, "replaces": stored.id}
        new.save(update_fields=["metadata", "updated_at"])
        CurationEvent.objects.create(trajectory_id=new_id, action="import_replaces",
                                     reason=f"re-imported from {file} with replace", before={},
                                     after={"replaces": stored.id})


def _batches(records: Iterator[TrajectoryRecord]) -> Iterator[list[TrajectoryRecord]]:
    while batch := list(islice(records, BATCH)):
        yield batch


def trajectories_import_path(
    *,
    path: str | Path,
    format: str | None = None,
    on_file: Callable[[FileReport], None] | None = None,
    on_runs: Callable[[int], None] | None = None,
    success_threshold: float | None = None,
    replace: bool = False,
) -> ImportReport:
    """Import a file, or every file under a directory (recursively, in name order, hidden files skipped).

    Each file is all or nothing on its own; one bad file does not stop the others. Files under a directory
    are named in source_refs by their path relative to it, so refs do not depend on where the tree lives.
    """
    root = Path(path)
    report = ImportReport()
    if not root.exists():
        report.files.append(FileReport(path=str(root), status=INVALID, error=f"{root}: no such file or directory"))
        return report
    files = trajectory_files(root)
    options: dict[str, Any] = {"format": format, "on_runs": on_runs, "success_threshold": success_threshold,
                               "replace": replace}
    for start in range(0, len(files), FILES_PER_COMMIT):
        # Many small files (a session or a trial each) share a commit, and are written together (see
        # _import_small); each file is still all or nothing, but the commit's flush is paid once per group.
        with transaction.atomic():
            for item in _import_group(files[start:start + FILES_PER_COMMIT], **options):
                report.files.append(item)
                if on_file:
                    on_file(item)
    reports_apply(report)
    return report


def _import_group(files: list[tuple[Path, str | None]], *, replace: bool, **options) -> Iterator[FileReport]:
    """The files' reports, in order. Runs of consecutive small files are imported together (_import_small);
    a large file, or any file with `replace` (rare, and it rewrites stored runs), on its own."""
    small: list[tuple[Path, str | None]] = []
    for file, name in files:
        if not replace and file.stat().st_size <= SMALL_FILE_BYTES:
            small.append((file, name))
            continue
        yield from _import_small(small, **options)
        small = []
        yield trajectories_import_file(path=file, name=name, replace=replace, **options)
    yield from _import_small(small, **options)


@dataclass
class _Staged:
    """A small file read whole, ready to be written with the others of its group."""

    file: Path
    name: str | None
    report: FileReport
    digest: str = ""
    original: bytes = b""
    records: list[TrajectoryRecord] = field(default_factory=list)


class _NotAlone(Exception):
    """A file of the group depends on what an earlier one writes (the same bytes, the same run, or the same
    content under another ref): the group is imported file by file instead."""


def _import_small(
    files: list[tuple[Path, str | None]], *, format: str | None, on_runs: Callable[[int], None] | None,
    success_threshold: float | None,
) -> list[FileReport]:
    """Import small files together: each is read, parsed and checked on its own first (a fault is that file's
    report, as in trajectories_import_file), then the readable ones are written at once: their originals in
    one blob write, one lookup of stored runs, one ingest call. If that write fails (a run the store refuses,
    a race) or a file depends on an earlier one of the group, it is undone and the group imported file by
    file, which names the bad file and keeps the others: the outcome is the same either way, only slower."""
    if not files:
        return []
    try:
        with transaction.atomic():  # a savepoint: a failed write leaves the group's transaction usable
            staged = [_stage(file, name, format) for file, name in files]
            _mark_present(staged)
            for item in staged:
                if not item.report.status:
                    _parse(item, success_threshold)
            writing = [item for item in staged if not item.report.status]
            _write_together(writing)
    except (TroveError, DatabaseError, _NotAlone):
        return [trajectories_import_file(path=file, format=format, name=name, on_runs=on_runs,
                                         success_threshold=success_threshold) for file, name in files]
    for item in writing:
        item.report.settle()
        if on_runs and item.records:
            on_runs(len(item.records))
    return [item.report for item in staged]


def _stage(file: Path, name: str | None, forced: str | None) -> _Staged:
    """The file's format and bytes, or its final report when it is not a trajectory file."""
    item = _Staged(file=file, name=name, report=FileReport(path=str(file)))
    try:
        item.report.format = _format_of(file, forced)
    except ImportFormatError as error:
        kind = reports.detect(file) if forced is None else None
        if kind:
            item.report.status, item.report.format = REPORT, kind
        else:
            item.report.status, item.report.error = UNRECOGNISED, error.message
        return item
    item.original = file.read_bytes()
    item.digest = hashlib.sha256(item.original).hexdigest()
    return item


def _mark_present(staged: list[_Staged]) -> None:
    """Files whose bytes were imported before are present (one query for the group)."""
    digests = [item.digest for item in staged if item.digest]
    if len(set(digests)) != len(digests):
        raise _NotAlone  # the same bytes twice in the group: the second is present once the first is stored
    earlier: dict[str, list[int]] = {}
    rows = Trajectory.objects.filter(original_blob__in=digests).order_by("id").values_list("original_blob", "id")
    for digest, pk in rows:
        earlier.setdefault(digest, []).append(pk)
    for item in staged:
        if item.digest in earlier:
            ids = earlier[item.digest]
            item.report.status, item.report.present, item.report.trajectory_ids = PRESENT, len(ids), ids


def _parse(item: _Staged, success_threshold: float | None) -> None:
    try:
        records = iter_records(item.file, item.report.format, name=item.name, success_threshold=success_threshold)
        item.records = [_fingerprinted(as_import(record)) for record in records]
    except TroveError as error:
        item.report.status, item.report.error = INVALID, error.message
    else:
        if len(item.records) > BATCH:
            raise _NotAlone  # a small file with many runs: written in batches, on its own


def _write_together(staged: list[_Staged]) -> None:
    """Write the staged files' runs in one go, deciding per file what is new, changed or a duplicate exactly as
    _import_runs would had the files been imported one after the other."""
    if not staged:
        return
    blobs_store({item.digest: item.original for item in staged})
    stored = _stored_rows([record for item in staged for record in item.records])
    earlier_refs: dict[str, TrajectoryRecord] = {}  # runs new to the store that an earlier file of the group writes
    earlier_content: set[str] = set()
    fresh_by_file = []
    for item in staged:
        by_ref, by_content = _split_stored(stored, item.records)
        fresh, retired = _sort_batch(item.records, item.report, replace=False, file=item.report.path,
                                     stored=(by_ref, by_content))
        assert not retired  # only `replace` retires runs
        for record in fresh:
            if record.source_ref in by_ref:
                continue
            twin = earlier_refs.get(record.source_ref)
            if twin is not None and _record_differences(twin, record):
                raise _NotAlone  # reported as changed against the earlier file's run, one file at a time
            if twin is None and record.metadata[FINGERPRINT_KEY] in earlier_content:
                raise _NotAlone  # a duplicate of the earlier file's run, whose id is known once it is stored
        for record in fresh:
            if record.source_ref not in by_ref:
                earlier_refs.setdefault(record.source_ref, record)
                earlier_content.add(record.metadata[FINGERPRINT_KEY])
        fresh_by_file.append(fresh)
    records = [record for fresh in fresh_by_file for record in fresh]
    originals = [item.digest for item, fresh in zip(staged, fresh_by_file, strict=True) for _ in fresh]
    outcomes = iter(trajectories_ingest_many(records=records, original_blobs=originals,
                                             field_prefix="record {index}: ") if records else [])
    for item, fresh in zip(staged, fresh_by_file, strict=True):
        for outcome in islice(outcomes, len(fresh)):
            item.report.trajectory_ids.append(outcome.trajectory_id)
            if outcome.created:
                item.report.imported += 1
            else:
                item.report.present += 1


def _record_differences(earlier: TrajectoryRecord, record: TrajectoryRecord) -> str:
    """What differs between two versions of a run, as _differences sees a stored one."""
    stored = _Stored(id=0, source_ref=earlier.source_ref, task_key=earlier.task_key,
                     fingerprint=earlier.metadata[FINGERPRINT_KEY], reward=earlier.reward, success=earlier.success,
                     n_steps=len(earlier.steps))
    return _differences(stored, record)


def reports_apply(report: ImportReport) -> None:
    """Label the import's runs from the evaluation reports found among its files (status `report`), each
    report's result in its FileReport.labels. Only the runs this import read (new or already stored) are in
    scope: a report beside trajectories speaks of them. A report that cannot be read is invalid."""
    scope_ids = {i for f in report.files if f.status != REPORT for i in f.trajectory_ids}
    scope = Trajectory.objects.filter(pk__in=scope_ids)
    for item in report.files:
        if item.status != REPORT:
            continue
        try:
            labels = reports.read_labels(Path(item.path))
        except TroveError as error:
            item.status, item.error = INVALID, error.message
            continue
        item.labels = trajectories_label_from_report(labels=labels, scope=scope, source=item.path).as_dict()


def trajectory_files(root: Path) -> list[tuple[Path, str | None]]:
    """(file, name for its source_refs) for a file, or for every file under a directory."""
    if root.is_file():
        return [(root, None)]
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    # a Harbor trial's files all read as the trial: read it once (from its trajectory), not once per file
    return [(p, p.relative_to(root).as_posix()) for p in files if not harbor.read_with_trial(p)]


def _hidden(relative: Path) -> bool:
    *folders, name = relative.parts
    hidden_name = name.startswith(".") and name not in unsupported.DOTFILE_NAMES
    return hidden_name or any(part.startswith(".") for part in folders)


def trajectories_import_upload(
    *, filename: str, chunks: Iterable[bytes], format: str | None = None
) -> FileReport:
    """Import an uploaded file (given as byte chunks) like trajectories_import_file, from a temporary copy:
    importers read paths (an Inspect .eval is a zip). The report names the file by `filename`."""
    name = Path(filename).name or "upload"
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="trove-upload-") as folder:
        target = Path(folder) / name
        with open(target, "wb") as handle:
            for chunk in chunks:
                digest.update(chunk)
                handle.write(chunk)
        return trajectories_import_file(path=target, format=format, name=upload_name(name, digest.hexdigest()),
                                        label=name)


def upload_name(filename: str, content_digest: str) -> str:
    """The source_ref name of an uploaded file: its name and content hash. An upload has no folder to tell
    two `output.jsonl` apart, so the content does; the same file uploaded again gets the same refs."""
    return f"upload/{content_digest[:16]}/{Path(filename).name}"
