"""Importers: read agent trajectories written by other harnesses into TrajectoryRecords. ORM-free.

Formats (registry key -> module): `trove` (Trove's own JSONL export), `harbor` (Harbor / Terminal-Bench
trial directories: result.json with the verifier's reward, the agent's ATIF trajectory), `atif` (Harbor's
Agent Trajectory Interchange Format, up to v1.7), `inspect` (Inspect AI .json and .eval logs), `mini_swe_agent` (.traj.json),
`swe_agent` (.traj), `swe_agent_rows` (SWE-agent rows of published datasets: JSON, JSONL, Parquet),
`openhands` (evaluation output.jsonl and event-stream .json), `claude_code` (Claude Code session
transcripts), `codex` (Codex CLI rollouts), `openai_conversations` (OpenAI-format conversations in one JSON
document: tau-bench trajectory arrays, wrapping objects), `openai_messages` (JSONL of OpenAI-format
conversations). Files of formats not read yet (aider, Gemini CLI, ...) are named in the error
(experience.importers.unsupported); evaluation reports are read by experience.importers.reports.
Each module exposes
`detect(path, head: bytes) -> bool` and `parse(path, *, name=None) -> Iterator[TrajectoryRecord]`.

Use:
    fmt = detect_format(path)                       # or raises ImportFormatError
    for record in iter_records(path, name="runs/output.jsonl"):
        ...

Contract for callers that must write all or nothing per file:
- `iter_records` streams: it parses one run at a time (a JSONL of 10,000 runs is never held whole; an
  .eval archive is read one sample member at a time) and every record it yields has passed
  `validate_record` in full. A fault later in the file raises only when the iteration reaches it, after
  earlier records were yielded. So either consume it inside one database transaction, which the error
  rolls back, or run `validate_file(path)` first (a full pass that keeps nothing) and write on a second
  pass, or use `read_all` for files small enough to hold in memory.
- Errors are ImportFormatError (not this format, truncated, corrupted, not JSON, a bad zip) and
  ImportValidationError (a run lacks a field or has one of the wrong type). Both name the file and, where
  known, the line, record index and field, e.g. "output.jsonl line 3: field 'history' missing".
- `name` is the file's name inside each record's source_ref (default: parent folder / file name). When
  importing a tree, pass the path relative to the tree's root so refs stay stable wherever it is copied.
  source_ref is stable per run, so re-importing the same file is a no-op for the ingest service.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from experience.importers import (
    atif,
    claude_code,
    codex,
    conversations,
    harbor,
    inspect,
    mini_swe_agent,
    openai_messages,
    openhands,
    swe_agent,
    swe_agent_rows,
    trove,
    unsupported,
)
from experience.importers.base import Location, first_json_line, iter_jsonl, load_json_document, read_head
from experience.importers.errors import ImportFormatError, ImportValidationError, TrajectoryImportError
from experience.importers.outcomes import derive_success
from experience.importers.validate import validate_record
from experience.records import TrajectoryRecord


class Importer(Protocol):
    FORMAT: str

    def detect(self, path: Path, head: bytes) -> bool: ...

    def parse(self, path: Path, *, name: str | None = None) -> Iterator[TrajectoryRecord]: ...


# Most specific first: a Trove export or an ATIF file would also pass looser checks further down, and a
# Harbor trial's agent/trajectory.json is ATIF that the trial's result.json gives its outcome.
REGISTRY: dict[str, Importer] = {
    module.FORMAT: module  # type: ignore[misc]
    for module in (
        trove, harbor, atif, inspect, mini_swe_agent, swe_agent, swe_agent_rows, openhands, claude_code, codex, conversations,
        openai_messages,
    )
}

_EXPECTED = (
    "a Trove export (.jsonl), a Harbor trial (result.json, agent/trajectory.json), an ATIF trajectory (.json), an Inspect AI log (.json or .eval), a mini-swe-agent "
    "trajectory (.traj.json), a SWE-agent trajectory (.traj), SWE-agent dataset rows (JSON, JSONL or Parquet), "
    "OpenHands output.jsonl or event-stream .json, a Claude Code session (.jsonl), a Codex CLI rollout (rollout-*.jsonl), "
    "OpenAI-format conversations as JSONL or as a JSON array (tau-bench trajectories)"
)

# Faults of a corrupted file that get past the format checks surface as these while a parser walks it.
_PARSE_FAULTS = (TypeError, ValueError, KeyError, AttributeError, IndexError)


def detect_format(path: str | Path) -> str:
    """The registry key of the file's format. Raises ImportFormatError naming the file when none matches."""
    path = Path(path)
    head = read_head(path)
    if not head.strip():
        raise ImportFormatError(path, "the file is empty")
    for key, importer in REGISTRY.items():
        if importer.detect(path, head):
            return key
    if harbor.is_job_summary(path, head):
        raise ImportFormatError(path, "a Harbor job's summary, not a run: its trials are the folders beside it "
                                      "(import the job folder, or a trial's folder)")
    known = unsupported.identify(path, head)
    if known:
        raise ImportFormatError(
            path, f"format not recognised: this looks like {known}, which Trove does not import yet; "
                  f"it imports {_EXPECTED}")
    if head.lstrip()[:1] not in (b"{", b"["):
        raise ImportFormatError(path, f"format not recognised; expected {_EXPECTED}")
    problem = _json_problem(path)
    if problem:  # say why, rather than only that nothing matched: a cut file loses the keys detection reads
        raise ImportFormatError(path, f"format not recognised, and {problem}")
    raise ImportFormatError(
        path, f"format not recognised: valid JSON of an unknown shape ({_shape(path)}); expected {_EXPECTED}")


def _shape(path: Path) -> str:
    """What the top of a valid JSON (or JSONL) file holds, to tell a person what Trove saw."""
    try:
        value = load_json_document(path)
    except ImportFormatError:
        value = first_json_line(read_head(path))  # JSONL: its first line
    if isinstance(value, list):
        keys = sorted({k for item in value[:20] if isinstance(item, dict) for k in item})
        return f"a list of {len(value)} item(s)" + (f" with keys {', '.join(keys[:8])}" if keys else "")
    if isinstance(value, dict):
        return f"an object with keys {', '.join(sorted(value)[:8]) or '(none)'}"
    return f"a {type(value).__name__}"


def _json_problem(path: Path) -> str | None:
    """Why a JSON-looking file does not parse (truncated, corrupted), or None when it is valid JSON / JSONL."""
    try:
        load_json_document(path)
        return None
    except ImportFormatError as whole:
        if first_json_line(read_head(path)) is None:
            return f"it cannot be read as JSON: {whole.problem}"
    try:
        for _ in iter_jsonl(path):
            pass
    except ImportFormatError as line:
        return f"line {line.line} is not valid JSON: {line.problem}"
    return None


def iter_records(
    path: str | Path, format: str | None = None, *, name: str | None = None, success_threshold: float | None = None
) -> Iterator[TrajectoryRecord]:
    """Yield the file's runs one at a time, each fully validated. See the module docstring's contract.
    A run with a reward and no success verdict gets one derived by experience.importers.outcomes (0/1 rewards,
    or reward >= `success_threshold` when given), marked as derived in its metadata."""
    path = Path(path)
    key = format or detect_format(path)
    if key not in REGISTRY:
        raise ImportFormatError(path, f"unknown format {key!r}; known: {', '.join(REGISTRY)}")
    index = -1
    try:
        for index, record in enumerate(REGISTRY[key].parse(path, name=name)):
            yield validate_record(derive_success(record, success_threshold), Location(path, record=index))
    except TrajectoryImportError:
        raise
    except _PARSE_FAULTS as exc:
        raise ImportValidationError(
            path, f"cannot be read as {key} ({type(exc).__name__}: {exc})", record=index + 1
        ) from exc


def read_all(
    path: str | Path, format: str | None = None, *, name: str | None = None, success_threshold: float | None = None
) -> list[TrajectoryRecord]:
    """Every run of the file, or an error and nothing. Holds them all: for files that fit in memory."""
    return list(iter_records(path, format, name=name, success_threshold=success_threshold))


def validate_file(path: str | Path, format: str | None = None, *, name: str | None = None) -> int:
    """A full dry pass: raise the first fault of the file, else return how many runs it holds."""
    count = 0
    for _ in iter_records(path, format, name=name):
        count += 1
    return count


__all__ = [
    "REGISTRY",
    "ImportFormatError",
    "ImportValidationError",
    "Importer",
    "TrajectoryImportError",
    "detect_format",
    "iter_records",
    "read_all",
    "validate_file",
]
