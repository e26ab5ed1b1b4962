"""Importing trajectory files (any format experience.importers reads) into the store.

Per file, all or nothing: the file's runs are written in one transaction, so a fault anywhere in it (a
truncated last line, a run missing a field, a run over the store's limits) leaves nothing of that file
behind, and the report says what was wrong and where. The original file is kept as a blob
(Trajectory.original_blob on every run read from it), and its format and version are recorded on each run.
Every run imported has source `import`: a file cannot claim a run was a Trove rollout (a Trove export of
rollouts keeps the claim in metadata["claimed_source"], see experience.services.provenance).

Idempotent: a file whose bytes were imported before is reported as present without being parsed again, and
within a file every run already stored (same source and source_ref) is skipped, so importing the same file
again adds nothing.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from django.db import transaction

from experience.errors import TroveError
from experience.importers import REGISTRY, detect_format, iter_records
from experience.importers.errors import ImportFormatError
from experience.models import Trajectory
from experience.records import TrajectoryRecord
from experience.services.blobs import blobs_store
from experience.services.ingest import trajectories_ingest_many
from experience.services.provenance import as_import

BATCH = 200  # runs per ingest call: bounds memory on a file of 10,000 runs
ORIGINAL_MAX_BYTES = 256 * 1024 * 1024  # larger files are imported without keeping the original

IMPORTED, PRESENT, INVALID, UNRECOGNISED = "imported", "present", "invalid", "unrecognised"


@dataclass
class FileReport:
    """What importing one file did. `status`: imported (at least one new run), present (every run was
    already stored), invalid (nothing written; `error` says why), unrecognised (not a trajectory file)."""

    path: str
    status: str = ""
    format: str = ""
    imported: int = 0
    present: int = 0
    error: str = ""
    trajectory_ids: list[int] = field(default_factory=list)
    original_kept: bool = True

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in (
            "path", "status", "format", "imported", "present", "error", "trajectory_ids", "original_kept")}


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

    def as_dict(self) -> dict:
        return {
            "imported": self.imported,
            "present": self.present,
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
) -> FileReport:
    """Import every run of one file, or none of them. Never raises for a bad file: the report says why.

    `format` forces a format (a registry key of experience.importers) instead of detecting it; `name` is the
    file's name inside each run's source_ref (see experience.importers); `label` how the report names the
    file (default: the path); `on_runs(n)` is called as runs are stored, for progress bars;
    `success_threshold` the reward at or above which a run without a verdict succeeded (see
    experience.importers.outcomes: without it only 0/1 rewards decide).
    """
    path = Path(path)
    report = FileReport(path=label or str(path))
    try:
        report.format = _format_of(path, format)
    except ImportFormatError as error:
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
                     success_threshold=success_threshold)
    except TroveError as error:
        report.status, report.error, report.imported, report.present = INVALID, error.message, 0, 0
        report.trajectory_ids = []
        return report
    report.status = IMPORTED if report.imported else PRESENT
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
    on_runs: Callable[[int], None] | None, success_threshold: float | None = None,
) -> None:
    # One transaction for the whole file: iter_records raises late for a fault late in the file (its
    # contract), and that error must take the runs already written with it.
    with transaction.atomic():
        if original is not None:
            blobs_store({digest: original})
        index = 0
        # Every run read from a file is an import, whatever the file claims (provenance.as_import).
        for batch in _batches(map(as_import, iter_records(path, report.format, name=name,
                                                           success_threshold=success_threshold))):
            outcomes = trajectories_ingest_many(
                records=batch, original_blob=digest if original is not None else "",
                field_prefix="record {index}: ", index_offset=index,
            )
            index += len(batch)
            for outcome in outcomes:
                report.trajectory_ids.append(outcome.trajectory_id)
                if outcome.created:
                    report.imported += 1
                else:
                    report.present += 1
            if on_runs:
                on_runs(len(batch))


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
    for file, name in trajectory_files(root):
        item = trajectories_import_file(path=file, format=format, name=name, on_runs=on_runs,
                                        success_threshold=success_threshold)
        report.files.append(item)
        if on_file:
            on_file(item)
    return report


def trajectory_files(root: Path) -> list[tuple[Path, str | None]]:
    """(file, name for its source_refs) for a file, or for every file under a directory."""
    if root.is_file():
        return [(root, None)]
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    return [(p, p.relative_to(root).as_posix()) for p in files]


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


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
