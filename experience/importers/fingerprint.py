"""A run's content fingerprint: what makes two imported runs the same run, wherever the file was and however
it was serialised.

The fingerprint hashes the task key, the instruction and each step's content (kind, text, command, output,
reply, tool calls, exit code, error flag, model), in order. It leaves out what moves when a file is copied,
renamed or re-serialised: source_ref (the path), source_format, payload (line numbers, indices), request
contexts (derived from the steps), metadata, timestamps and the outcome. So a JSONL of conversations and
the same conversations as a pretty-printed JSON array have one fingerprint per run; a run whose steps
changed has another. The outcome is compared separately (a relabelled run is the same run, changed).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from experience.records import StepRecord, TrajectoryRecord

FINGERPRINT_KEY = "content_fingerprint"
VERSION = "trove-run-content-v1"


def fingerprint(record: TrajectoryRecord) -> str:
    """sha256 hex of the record's content (see module docstring)."""
    digest = hashlib.sha256()
    digest.update(_canonical([VERSION, record.task_key, record.instruction]))
    for step in record.steps:
        digest.update(b"\n")
        digest.update(_canonical(_step_content(step)))
    return digest.hexdigest()


def _step_content(step: StepRecord) -> list[Any]:
    return [step.kind, step.text, step.command, step.output, step.response_text, step.tool_calls, step.exit_code,
            step.is_error, step.model]


def _canonical(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
