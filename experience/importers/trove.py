"""Trove's own JSONL export (see experience.exporters.trove_jsonl), read back exactly as written.

Records keep their original source, source_format, source_version and source_ref as the export wrote them;
the import service then stores every run as source `import` (a file cannot make a run a Trove rollout) and
keeps the source the file claimed in metadata["claimed_source"] (experience.services.provenance).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from experience.exporters.trove_jsonl import FORMAT_MARKER, MARKER_KEY, record_from_dict
from experience.importers.base import Location, iter_jsonl
from experience.importers.fingerprint import FINGERPRINT_KEY
from experience.records import TrajectoryRecord

FORMAT = "trove"
_MARKER = re.compile(rb'^\s*\{\s*"' + MARKER_KEY.encode() + rb'"\s*:\s*"trove-trajectory-')


def detect(path: Path, head: bytes) -> bool:
    return bool(_MARKER.match(head))


def parse(path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]:
    for record_index, (line, obj) in enumerate(iter_jsonl(path)):
        loc = Location(path, line=line, record=record_index)
        if not isinstance(obj, dict):
            raise loc.invalid(None, "each line must be a JSON object")
        if obj.get(MARKER_KEY) != FORMAT_MARKER:
            raise loc.invalid(MARKER_KEY, f"must be {FORMAT_MARKER!r}, got {obj.get(MARKER_KEY)!r}")
        yield _decode(obj, loc)


def _decode(obj: dict, loc: Location) -> TrajectoryRecord:
    try:
        record = record_from_dict(obj)
        # the store's content fingerprint, not the run's: the import service computes it again
        record.metadata.pop(FINGERPRINT_KEY, None)
        return record
    except KeyError as exc:
        raise loc.invalid(str(exc.args[0]), "missing") from None
    except (TypeError, ValueError) as exc:
        field, _, problem = str(exc).partition(": ")
        raise loc.invalid(field, problem or "has the wrong type") from None
