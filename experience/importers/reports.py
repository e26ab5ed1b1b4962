"""Evaluation reports and outcome files: what they say about which runs, as labels. ORM-free.

Read here (`detect` / `read_labels`):
- a SWE-bench evaluation summary, as the harness (`<model>.<run_id>.json`) and sb-cli write it:
  {"resolved_ids": [...], "unresolved_ids": [...], "empty_patch_ids"?, "error_ids"?, "incomplete_ids"?,
  "submitted_instances"?, ...}: resolved ids succeeded (reward 1), unresolved and empty-patch ids failed
  (reward 0); error and incomplete ids are named (`Label.success` None) but label nothing, since the
  evaluation, not the agent, failed;
- a SWE-bench per-instance report, logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json:
  {"<instance_id>": {"resolved": bool, "patch_successfully_applied"?, "tests_status"?}};
- a JSONL of outcomes, one {target, reward?, success? (or resolved / score ...)} per line, the target a
  trajectory id ("trajectory_id" or "run"), a "source_ref", or a task ("task_key" / "task_id" /
  "instance_id", with "sample" / "trial" optional); a 0/1 reward without a verdict sets success as on
  import (experience.importers.outcomes).

Each label says which runs it means (`Target`) and, where the report tells it, the model or run name
(`names`), so runs of several models on one instance are told apart.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experience.importers.base import (
    Location,
    as_dict,
    first_json_line,
    iter_jsonl,
    load_json_document,
    read_head,
)
from experience.importers.errors import ImportFormatError
from experience.importers.limits import loads_json
from experience.importers.outcomes import outcome_of

SWE_BENCH_SUMMARY, SWE_BENCH_INSTANCE, OUTCOMES_JSONL = "swe-bench-summary", "swe-bench-instance", "outcomes-jsonl"
_FAILED_LISTS = ("unresolved_ids", "empty_patch_ids")
_UNJUDGED_LISTS = ("error_ids", "incomplete_ids")
_TASK_KEYS = ("task_key", "task_id", "instance_id")
_SAMPLE_KEYS = ("sample", "trial")
_MAX_REPORT_BYTES = 64 * 1024 * 1024
# a line holding a run's steps is a trajectory with its outcome, not an outcome of a stored run
_RUN_KEYS = frozenset({"messages", "traj", "trajectory", "history", "steps", "conversation", "trove_format"})


@dataclass(frozen=True)
class Target:
    trajectory_id: int | None = None
    source_ref: str = ""
    task_key: str = ""
    sample: Any = None

    def describe(self) -> str:
        if self.trajectory_id is not None:
            return f"run {self.trajectory_id}"
        if self.source_ref:
            return self.source_ref
        return self.task_key + (f" (sample {self.sample})" if self.sample is not None else "")


@dataclass(frozen=True)
class Label:
    """What a report says of the runs `target` names: success and reward, or (success None) that it could not
    judge them."""

    target: Target
    success: bool | None
    reward: float | None
    names: frozenset[str] = frozenset()  # model / run names the report gives; empty when it gives none


def detect(path: Path) -> str | None:
    """The kind of report the file is, or None."""
    head = read_head(path)
    stripped = head.lstrip()
    if stripped[:1] == b"{" and b'"resolved_ids"' in head[:1 << 16]:
        return SWE_BENCH_SUMMARY if isinstance(as_dict(_document(path)).get("resolved_ids"), list) else None
    if path.name == "report.json" and stripped[:1] == b"{":
        return SWE_BENCH_INSTANCE if _instance_entries(_document(path)) else None
    line = first_json_line(head)
    if isinstance(line, dict) and _target_keys(line) and _has_outcome(line) and not _RUN_KEYS & set(line):
        return OUTCOMES_JSONL
    return None


def _document(path: Path) -> Any:
    if path.stat().st_size > _MAX_REPORT_BYTES:
        return None
    try:
        return loads_json(path.read_bytes())
    except ValueError:
        return None


def _instance_entries(document: Any) -> dict[str, dict[str, Any]]:
    entries = {key: value for key, value in as_dict(document).items() if isinstance(value, dict)}
    if entries and all(isinstance(value.get("resolved"), bool) for value in entries.values()):
        return entries
    return {}


def _target_keys(line: dict[str, Any]) -> bool:
    return any(key in line for key in ("trajectory_id", "run", "source_ref", *_TASK_KEYS))


def _has_outcome(line: dict[str, Any]) -> bool:
    return any(key in line for key in ("reward", "score", "success", "resolved", "passed"))


def read_labels(path: Path) -> list[Label]:
    """The file's labels. Raises ImportFormatError when it is no report this module reads."""
    kind = detect(path)
    if kind == SWE_BENCH_SUMMARY:
        return list(_summary_labels(path))
    if kind == SWE_BENCH_INSTANCE:
        return list(_instance_labels(path))
    if kind == OUTCOMES_JSONL:
        return list(_jsonl_labels(path))
    raise ImportFormatError(path, "not an evaluation report: expected a SWE-bench summary (resolved_ids / "
                                  "unresolved_ids), a SWE-bench logs/<instance_id>/report.json, or a JSONL of "
                                  "{trajectory_id | source_ref | task_key [, sample], reward, success}")


def read_labels_from_bytes(data: bytes, *, name: str) -> list[Label]:
    """The labels of a report given as bytes (an upload, an API body), read as the file `name` would be: a
    per-instance report is known by its name, report.json. Errors name the file by `name` (they give only a
    file's name, never the temporary folder)."""
    safe = Path(name).name or "report"
    with tempfile.TemporaryDirectory(prefix="trove-report-") as folder:
        path = Path(folder) / safe
        path.write_bytes(data)
        return read_labels(path)


def _summary_labels(path: Path) -> Iterator[Label]:
    document = as_dict(load_json_document(path))
    names = _summary_names(path, document)
    for key, success in (("resolved_ids", True), *((k, False) for k in _FAILED_LISTS),
                         *((k, None) for k in _UNJUDGED_LISTS)):
        for instance in document.get(key) or []:
            reward = None if success is None else float(success)
            yield Label(Target(task_key=str(instance)), success, reward, names)


def _summary_names(path: Path, document: dict[str, Any]) -> frozenset[str]:
    """The harness names its summary <model>.<run_id>.json; model names hold dots too, so every split counts."""
    names = {str(document[k]) for k in ("model_name_or_path", "run_id") if document.get(k)}
    stem = path.name.removesuffix(".json")
    parts = stem.split(".")
    names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    names.update(".".join(parts[i:]) for i in range(1, len(parts)))
    return frozenset(n for n in names if n and n not in ("report", "results", "summary"))


def _instance_labels(path: Path) -> Iterator[Label]:
    entries = _instance_entries(load_json_document(path))
    # logs/run_evaluation/<run_id>/<model>/<instance_id>/report.json
    folders = path.parent.parts
    names = frozenset(folders[-3:-1]) if len(folders) >= 3 and folders[-1] in entries else frozenset()
    for instance, entry in entries.items():
        resolved = bool(entry["resolved"])
        yield Label(Target(task_key=instance), resolved, float(resolved), names)


def _jsonl_labels(path: Path) -> Iterator[Label]:
    for number, line in iter_jsonl(path):
        loc = Location(path, line=number)
        if not isinstance(line, dict):
            raise loc.invalid(None, "each line must be a JSON object")
        reward, success = outcome_of(line, loc)
        if reward is None and success is None:
            raise loc.invalid("reward", "missing (give reward and/or success)")
        if success is None and reward in (0.0, 1.0):
            success = reward >= 1.0
        names = frozenset(str(line[k]) for k in ("model", "run_name") if line.get(k))
        yield Label(_target(line, loc), success, reward, names)


def _target(line: dict[str, Any], loc: Location) -> Target:
    for key in ("trajectory_id", "run"):
        if line.get(key) is not None:
            value = line[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise loc.invalid(key, "must be a trajectory id (an integer)")
            return Target(trajectory_id=value)
    if isinstance(line.get("source_ref"), str) and line["source_ref"]:
        return Target(source_ref=line["source_ref"])
    task = next((line[k] for k in _TASK_KEYS if line.get(k) is not None), None)
    if task is None:
        raise loc.invalid("trajectory_id", "missing: name the run (trajectory_id, source_ref or task_key)")
    sample = next((line[k] for k in _SAMPLE_KEYS if line.get(k) is not None), None)
    return Target(task_key=str(task), sample=sample)
