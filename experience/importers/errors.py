"""Errors raised while reading trajectory files.

Both name the file, and where they can the line (JSONL), the record's index within the file and the
field, so a person can find the fault: "output.jsonl line 3: field 'history' missing".
They subclass the store's ValidationError, so the API's exception handler answers them with a 400.
"""

from __future__ import annotations

from pathlib import Path

from experience.errors import ValidationError


class TrajectoryImportError(ValidationError):
    """Base of the importer errors. `path` is the file; `line`, `record` and `field` narrow it down."""

    code = "import_error"

    def __init__(
        self,
        path: str | Path,
        problem: str,
        *,
        line: int | None = None,
        record: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.record = record
        self.problem = problem
        super().__init__(f"{_where(self.path, line, record)}: {problem}", field=field)


class ImportFormatError(TrajectoryImportError):
    """The file is not in the expected format: unrecognised, truncated, corrupted, not JSON, a bad zip."""

    code = "import_format"


class ImportValidationError(TrajectoryImportError):
    """The file parses, but a run in it lacks a required field or has one of the wrong type."""

    code = "import_invalid"


def _where(path: Path, line: int | None, record: int | None) -> str:
    where = path.name
    if line is not None:
        where += f" line {line}"
    elif record is not None:
        where += f" record {record}"
    return where
