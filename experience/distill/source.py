"""A run as distillation receives it: the record plus what the store knows about it.

The build service streams these out of the database; everything downstream is a generator over them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, is_dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from experience.distill.rubric import Rubric, rubric
from experience.records import TrajectoryRecord

if TYPE_CHECKING:
    from experience.distill.digest import RunDigest

CURATION_REJECTED = "rejected"
# Runs in these states say nothing about the agent: the harness or the operator ended them.
UNUSABLE_STATUSES = ("running", "infra_error", "cancelled")


@dataclass(frozen=True)
class SourceRun:
    """One stored trajectory and its store-side metadata.

    `trajectory_id` is the store's id as a string. `content_hash` identifies the record's content for the
    manifest; when empty it is computed from the record (`record_content_hash`). `curation` is the curation
    status (`rejected` is left out unless the spec includes it; anything else is kept). `is_duplicate` is
    the dedup mark; `duplicate_outcome_differs` says the run it marks this one a duplicate of has another
    outcome (or is gone), so the mark does not let a build leave this run out. `task_set` and `task_key`
    come from the record.

    `step_labels`: curators' labels on its steps, written into every row made from it (`step_label_values`).

    `digest`: the run's decisions as the store keeps them (`digest.RunDigest`), when it
    was read instead of the run's steps (then `record.steps` is empty); value rows are made from it.
    """

    trajectory_id: str
    record: TrajectoryRecord
    content_hash: str = ""
    curation: str = ""
    is_duplicate: bool = False
    digest: RunDigest | None = None
    duplicate_outcome_differs: bool = False
    # Curators' step labels on the run: (step index, label, note), in step order (services.step_labels).
    step_labels: tuple[tuple[int, str, str], ...] = ()
    # Curators' verdicts on rubric labels, (label, value): they win over the detectors in the rows.
    rubric_overrides: tuple[tuple[str, bool], ...] = ()

    @property
    def task_key(self) -> str:
        return self.record.task_key

    @cached_property
    def scored(self) -> Rubric:
        """The run's rubric, made once: the build writes its labels and its value rows read them."""
        return rubric(self.record)

    def resolved_hash(self) -> str:
        return self.content_hash or record_content_hash(self.record)


def record_content_hash(record: TrajectoryRecord) -> str:
    """sha256 of the record's canonical JSON (sorted keys; datetimes as ISO strings)."""
    # `default` walks the dataclasses in place; asdict() would deep-copy every step first.
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_success(record: TrajectoryRecord) -> bool | None:
    """Whether the run solved its task: `success` if recorded, else `reward > 0`, else unknown (None)."""
    if record.success is not None:
        return record.success
    if record.reward is not None:
        return record.reward > 0
    return None


def run_return(record: TrajectoryRecord) -> float | None:
    """The run's return R: its reward if recorded, else 1.0 for success and 0.0 for failure."""
    if record.reward is not None:
        return float(record.reward)
    success = run_success(record)
    return None if success is None else float(success)


def step_label_values(run: SourceRun) -> list[dict[str, Any]]:
    """The run's curator step labels as a row's `step_labels` column (schemas.STEP_LABELS), in step order."""
    return [{"step": step, "label": label, "note": note} for step, label, note in run.step_labels]


def _json_default(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)
