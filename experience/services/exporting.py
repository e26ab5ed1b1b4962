"""Exporting any selection of trajectories as Trove JSONL (lossless, re-importable) or ATIF (one document
per line), streamed: runs are read a chunk at a time and written a run at a time, so neither the
selection nor the file is ever held whole.

Duplicates are left out unless the selection asks for them (`duplicate=any` or `only`), as the design says
exports should: a dataset built from an export should not count one run twice.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from typing import IO, Any

from experience.errors import ValidationError
from experience.exporters import atif, trove_jsonl
from experience.records import TrajectoryRecord
from experience.search import TrajectoryFilters, filters_from_params, trajectory_search
from experience.services.stored import stored_records

EXPORT_FORMATS = ("trove", "atif")
CONTENT_TYPE = "application/x-ndjson"


def export_filters(params: Mapping[str, Any]) -> TrajectoryFilters:
    """Filters for an export from query-style parameters: as for search, but duplicates left out by default."""
    params = dict(params)
    params.setdefault("duplicate", "exclude")
    return filters_from_params(params)


def check_export_format(format: str) -> str:
    if format not in EXPORT_FORMATS:
        raise ValidationError(f"format: {format!r} is not one of {', '.join(EXPORT_FORMATS)}", field="format")
    return format


def export_filename(format: str) -> str:
    return f"trajectories.{check_export_format(format)}.jsonl"


def trajectories_export(*, filters: TrajectoryFilters, format: str) -> Iterator[bytes]:
    """The export as a stream of byte chunks, one run per chunk (one JSONL line each)."""
    check_export_format(format)
    queryset = trajectory_search(filters=filters)
    for _, record in stored_records(queryset):
        yield _line(record, format).encode()


def trajectories_export_to(*, filters: TrajectoryFilters, format: str, fileobj: IO[bytes]) -> int:
    """Write the export to a binary file object. Returns how many runs were written."""
    count = 0
    for chunk in trajectories_export(filters=filters, format=format):
        fileobj.write(chunk)
        count += 1
    return count


def _line(record: TrajectoryRecord, format: str) -> str:
    if format == "trove":
        return trove_jsonl.dumps(record) + "\n"
    buffer = io.StringIO()
    atif.dump(record, buffer)
    return buffer.getvalue() + "\n"
