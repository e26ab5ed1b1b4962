"""Task sets from JSONL with SWE-bench-style fields. Every line is validated before anything is written.

One task per line (blank lines are skipped):

    instance_id        required  the task's key, unique in the file
    problem_statement  required  what the agent is asked to do
    eval_command       required  run in the sandbox after the harness ends
    success_exit_code  optional  the evaluation passes when eval_command exits with this code (default 0)
    files              optional  {relative path: text} written to the workspace
    snapshot_b64       optional  the repository as a base64 tar.gz of its files (paths relative to the
                                 workspace: pack with `tar -C repo -czf - .`); text files only; `files`
                                 entries are written over it
    setup_commands     optional  list of shell commands run before the harness
    protected_paths    optional  workspace paths (a directory ends in "/", default ["tests/"]) that the
                                 evaluation removes and writes back from `files`: whatever the agent did
                                 to them, the evaluation sees the task's own
    eval_files         optional  {relative path: text} hidden evaluation files (e.g. the FAIL_TO_PASS tests):
                                 never in the agent's workspace, written only for the evaluation
    eval_timeout_s     optional  seconds (default 60)
    title, difficulty  optional
    FAIL_TO_PASS, PASS_TO_PASS   optional lists of test ids (or SWE-bench's JSON-encoded strings), kept in
                                 the task's metadata
    any other field    kept in the task's metadata (repo, base_commit, version, hints_text, ...)
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import posixpath
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from experience.errors import Conflict, ValidationError
from experience.importers.limits import JsonTooDeep, LimitBreached, gunzip_bounded, loads_json
from webapp.rollouts.models import Task, TaskSet

REQUIRED = ("instance_id", "problem_statement", "eval_command")
OWN_FIELDS = {
    "instance_id", "problem_statement", "eval_command", "success_exit_code", "files", "snapshot_b64",
    "setup_commands", "eval_timeout_s", "title", "difficulty", "protected_paths", "eval_files",
}
MAX_PROTECTED_PATHS = 1000
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
MAX_ERRORS_SHOWN = 20
MAX_TASKS = 100_000
MAX_SNAPSHOT_FILES = 20_000
MAX_EVAL_TIMEOUT_S = 3600
MAX_NAME = 100  # TaskSet.name


class TaskSetImportError(ValidationError):
    """The file is not a valid task set. `errors` lists every problem found, each naming its line and field."""

    code = "invalid_task_set"

    def __init__(self, errors: list[LineError]) -> None:
        shown = [str(e) for e in errors[:MAX_ERRORS_SHOWN]]
        more = len(errors) - len(shown)
        message = "; ".join(shown) + (f"; and {more} more" if more else "")
        super().__init__(message, field=errors[0].field or "file")
        self.errors = errors


@dataclass(frozen=True)
class LineError:
    line: int
    field: str
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: field {self.field!r} {self.problem}" if self.field else f"line {self.line}: {self.problem}"


class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field, self.problem = field, problem


def taskset_import_jsonl(*, name: str, fileobj: Iterable[bytes | str], description: str = "") -> TaskSet:
    """Validate every line, then create the task set and its tasks in one transaction. All or nothing.

    Raises TaskSetImportError (naming each bad line and field) before writing anything, and Conflict if a
    task set of that name exists (imported sets are not overwritten: jobs that ran them keep their meaning).
    """
    name = (name or "").strip()
    if not name or len(name) > MAX_NAME:
        raise ValidationError("name: a task set name of 1 to 100 characters is required", field="name")
    tasks = parse_tasks(fileobj)
    with transaction.atomic():
        if TaskSet.objects.filter(name=name).exists():
            raise Conflict(f"name: a task set named {name!r} already exists", field="name")
        task_set = TaskSet.objects.create(name=name, description=description, source="jsonl")
        Task.objects.bulk_create([Task(task_set=task_set, **fields) for fields in tasks], batch_size=500)
    return task_set


def parse_tasks(fileobj: Iterable[bytes | str]) -> list[dict]:
    """Task fields for every line, or TaskSetImportError listing every problem. No database."""
    tasks: list[dict] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for number, raw in _lines(fileobj):
        try:
            task = _task_from_line(raw)
        except _Invalid as invalid:
            errors.append(LineError(number, invalid.field, invalid.problem))
            continue
        if task["key"] in seen:
            errors.append(LineError(number, "instance_id", f"repeats line {seen[task['key']]} ({task['key']!r})"))
            continue
        seen[task["key"]] = number
        tasks.append(task)
        if len(tasks) > MAX_TASKS:
            errors.append(LineError(number, "", f"more than {MAX_TASKS} tasks in one file"))
            break
    if not tasks and not errors:
        errors.append(LineError(1, "", "the file has no tasks"))
    if errors:
        raise TaskSetImportError(errors)
    return tasks


def _lines(fileobj: Iterable[bytes | str]) -> Iterator[tuple[int, str | None]]:
    """(line number, text) for each non-blank line; text None when the line is not UTF-8."""
    for number, raw in enumerate(fileobj, start=1):
        text: str
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, None
                continue
        else:
            text = raw
        if text.strip():
            yield number, text


def _task_from_line(raw: str | None) -> dict:
    if raw is None:
        raise _Invalid("", "is not UTF-8 text")
    try:
        record = loads_json(raw)
    except JsonTooDeep as error:
        raise _Invalid("", f"is refused: {error}") from None
    except json.JSONDecodeError as error:
        raise _Invalid("", f"is not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise _Invalid("", "must be a JSON object")
    for field in REQUIRED:
        if field not in record or record[field] is None:
            raise _Invalid(field, "missing")
    return {
        "key": _text(record, "instance_id", max_length=200),
        "instruction": _text(record, "problem_statement"),
        "eval_command": _text(record, "eval_command"),
        "success_exit_code": _integer(record, "success_exit_code", default=0, low=0, high=255),
        "eval_timeout_s": _integer(record, "eval_timeout_s", default=60, low=1, high=MAX_EVAL_TIMEOUT_S),
        "setup_commands": _commands(record),
        "files": _workspace_files(record),
        "protected_paths": _protected_paths(record),
        "eval_files": _eval_files(record),
        "title": _text(record, "title", max_length=300, required=False),
        "difficulty": _text(record, "difficulty", max_length=16, required=False),
        "metadata": _metadata(record),
    }


def _text(record: dict, field: str, *, max_length: int | None = None, required: bool = True) -> str:
    value = record.get(field, "")
    if not isinstance(value, str):
        raise _Invalid(field, f"must be a string, not {type(value).__name__}")
    if required and not value.strip():
        raise _Invalid(field, "is empty")
    if max_length and len(value) > max_length:
        raise _Invalid(field, f"is longer than {max_length} characters")
    return value


def _integer(record: dict, field: str, *, default: int, low: int, high: int) -> int:
    value = record.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(field, f"must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise _Invalid(field, f"must be between {low} and {high}")
    return value


def _commands(record: dict) -> list[str]:
    value = record.get("setup_commands", [])
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value):
        raise _Invalid("setup_commands", "must be a list of non-empty strings")
    return value


def _metadata(record: dict) -> dict:
    metadata = {k: v for k, v in record.items() if k not in OWN_FIELDS}
    for field in TEST_LISTS:
        if field in metadata:
            metadata[field] = _test_list(field, metadata[field])
    return metadata


def _test_list(field: str, value) -> list[str]:
    if isinstance(value, str):  # SWE-bench on the Hugging Face hub stores these as JSON-encoded strings
        try:
            value = loads_json(value)
        except ValueError:  # not JSON, or nested too deep
            raise _Invalid(field, "must be a list of test ids (or a JSON string of one)") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise _Invalid(field, "must be a list of test ids (strings)")
    return value


def _workspace_files(record: dict) -> dict[str, str]:
    files = _snapshot_files(record["snapshot_b64"]) if record.get("snapshot_b64") is not None else {}
    given = record.get("files", {})
    if not isinstance(given, dict) or not all(isinstance(t, str) for t in given.values()):
        raise _Invalid("files", "must be an object of {relative path: text}")
    for path, text in given.items():
        files[_safe_path("files", path)] = text
    size = sum(len(text) for text in files.values())
    if size > settings.TROVE_MAX_CONTENT_CHARS:
        raise _Invalid("files", f"hold {size} characters, more than the limit of {settings.TROVE_MAX_CONTENT_CHARS}")
    return files


def _protected_paths(record: dict) -> list[str]:
    value = record.get("protected_paths", ["tests/"])
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _Invalid("protected_paths", "must be a list of relative paths")
    if len(value) > MAX_PROTECTED_PATHS:
        raise _Invalid("protected_paths", f"holds more than {MAX_PROTECTED_PATHS} paths")
    # A directory keeps its trailing slash: it says "everything under it".
    return [_safe_path("protected_paths", p) + ("/" if p.rstrip().endswith("/") else "") for p in value]


def _eval_files(record: dict) -> dict[str, str]:
    given = record.get("eval_files", {})
    if not isinstance(given, dict) or not all(isinstance(t, str) for t in given.values()):
        raise _Invalid("eval_files", "must be an object of {relative path: text}")
    files = {_safe_path("eval_files", path): text for path, text in given.items()}
    size = sum(len(text) for text in files.values())
    if size > settings.TROVE_MAX_CONTENT_CHARS:
        raise _Invalid("eval_files", f"hold {size} characters, more than the limit of {settings.TROVE_MAX_CONTENT_CHARS}")
    return files


def _safe_path(field: str, path: str) -> str:
    """A normalised relative path inside the workspace, or _Invalid naming the field."""
    normal = posixpath.normpath(path.strip()) if isinstance(path, str) else ""
    if normal.startswith("./"):
        normal = normal[2:]
    if not normal or normal == "." or normal.startswith(("/", "../")) or normal == ".." or "\x00" in normal:
        raise _Invalid(field, f"path {path!r} must be relative and stay inside the workspace")
    return normal


def _snapshot_files(encoded) -> dict[str, str]:
    """Unpack a base64 tar.gz into {path: text}. Bounded in size and file count; links and devices refused."""
    if not isinstance(encoded, str):
        raise _Invalid("snapshot_b64", "must be a base64 string")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _Invalid("snapshot_b64", "is not valid base64") from None
    files: dict[str, str] = {}
    budget = settings.TROVE_MAX_CONTENT_CHARS
    # Inflated first, within the content budget and a header block per entry: tarfile itself would read a
    # long-name or pax header of any declared size whole, inflating a small upload to gigabytes.
    try:
        tar = gunzip_bounded(data, budget + 1024 * (MAX_SNAPSHOT_FILES + 2))
    except LimitBreached as error:
        raise _Invalid("snapshot_b64", str(error)) from None
    except (OSError, EOFError, zlib.error):
        raise _Invalid("snapshot_b64", "is not a readable tar.gz archive") from None
    try:
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
            for count, member in enumerate(archive):
                if count >= MAX_SNAPSHOT_FILES:
                    raise _Invalid("snapshot_b64", f"holds more than {MAX_SNAPSHOT_FILES} entries")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise _Invalid("snapshot_b64", f"member {member.name!r} is not a regular file")
                budget -= member.size
                if budget < 0:
                    raise _Invalid("snapshot_b64", f"unpacks to more than {settings.TROVE_MAX_CONTENT_CHARS} bytes")
                files[_safe_path("snapshot_b64", member.name)] = _member_text(archive, member)
    except (tarfile.TarError, OSError, EOFError):
        raise _Invalid("snapshot_b64", "is not a readable tar.gz archive") from None
    return files


def _member_text(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    handle = archive.extractfile(member)
    content = handle.read() if handle else b""
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise _Invalid("snapshot_b64", f"member {member.name!r} is not UTF-8 text (binary files are not supported)") from None
