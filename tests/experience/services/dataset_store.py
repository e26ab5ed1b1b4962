"""Runs stored through the real ingest service, for the dataset tests: small, readable coding-agent runs.

A `good` run reproduces the bug, edits the source, and sees the tests pass; a `bad` run edits blindly,
sees the tests fail and gives up. Each run's model calls carry the context the model saw, as the
recording proxy stores them, so the read path rebuilds contexts from blobs.
"""

from __future__ import annotations

import gzip
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from experience.models import DatasetVersion, Trajectory
from experience.records import MessageRecord, StepRecord, TrajectoryRecord
from experience.services import datasets
from experience.services.ingest import trajectory_ingest

SYSTEM = "You are a careful software engineer. Reply with one bash command in a ```bash block."
_refs = itertools.count(1)
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _commands(good: bool, task_key: str) -> list[tuple[str, str, int]]:
    if good:
        return [
            (f"cat src/{task_key}.py", "def parse(text):\n    return int(text)\n", 0),
            ("python reproduce.py", "Traceback (most recent call last):\nValueError: bad input", 1),
            (f"sed -i 's/int(text)/int(text.strip())/' src/{task_key}.py", "", 0),
            ("python reproduce.py", "42", 0),
            ("pytest tests", "12 passed in 0.4s", 0),
        ]
    return [
        (f"ls src && cat src/{task_key}.py", "def parse(text):\n    return int(text)\n", 0),
        (f"sed -i 's/int(text)/float(text)/' src/{task_key}.py", "", 0),
        ("pytest tests", "3 failed, 9 passed in 0.5s", 1),
        ("echo giving up", "giving up", 0),
    ]


def run_record(task_key: str, *, good: bool = True, **fields) -> TrajectoryRecord:
    """A run as the built-in harness records it: a model call, then its command, per decision."""
    instruction = f"Fix parse() in src/{task_key}.py: it crashes on input with surrounding spaces."
    messages = [MessageRecord("system", SYSTEM), MessageRecord("user", instruction)]
    steps: list[StepRecord] = []
    clock = T0
    for command, output, exit_code in _commands(good, task_key):
        reply = f"Next I run this.\n\n```bash\n{command}\n```"
        steps.append(
            StepRecord(
                kind="model_call",
                request_messages=list(messages),
                response_text=reply,
                tokens_in=40 * len(messages),
                tokens_out=20,
                started_at=clock,
                ended_at=clock + timedelta(milliseconds=300),
            )
        )
        steps.append(
            StepRecord(
                kind="command",
                command=command,
                output=output,
                exit_code=exit_code,
                started_at=clock + timedelta(milliseconds=400),
                ended_at=clock + timedelta(milliseconds=900),
            )
        )
        messages += [
            MessageRecord("assistant", reply),
            MessageRecord("user", f"exit code {exit_code}\n{output}"),
        ]
        clock += timedelta(seconds=1)
    defaults = {
        "source": "import", "source_format": "test", "source_ref": f"test-run-{next(_refs)}",
        "task_key": task_key, "task_set": "unit", "instruction": instruction, "harness": "builtin",
        "model": "policy-a", "status": "completed", "success": good, "reward": 1.0 if good else 0.0,
        "started_at": T0, "finished_at": clock,
    }  # fmt: skip
    return TrajectoryRecord(**(defaults | fields), steps=steps)


def store_run(
    task_key: str,
    *,
    good: bool = True,
    curation: str = "pending",
    tags: list[str] | None = None,
    duplicate_of: Trajectory | None = None,
    **fields,
) -> Trajectory:
    trajectory, _ = trajectory_ingest(record=run_record(task_key, good=good, **fields))
    updates = {"curation_status": curation, "tags": tags or []}
    if duplicate_of is not None:
        updates |= {"is_duplicate": True, "canonical": duplicate_of}
    Trajectory.objects.filter(pk=trajectory.pk).update(**updates)
    trajectory.refresh_from_db()
    return trajectory


def store_tasks(task_keys: list[str], *, good: int = 2, bad: int = 2, **fields) -> list[Trajectory]:
    """`good` successful and `bad` failed runs of each task."""
    return [store_run(key, good=index < good, **fields) for key in task_keys for index in range(good + bad)]


def rows_of(version: DatasetVersion) -> list[dict]:
    rows = []
    for name, relative in sorted(version.files.items()):
        if name.endswith(".jsonl.gz"):
            with gzip.open(Path(datasets.version_dir(version)).parent.parent / relative, "rt") as handle:
                rows += [json.loads(line) for line in handle]
    return rows


def same_content(a: DatasetVersion, b: DatasetVersion) -> None:
    assert a.content_hash == b.content_hash != ""
    assert [(f["name"], f["sha256"]) for f in a.manifest["files"]] == [
        (f["name"], f["sha256"]) for f in b.manifest["files"]
    ]
    assert a.manifest["store"] == b.manifest["store"]
    assert rows_of(a) == rows_of(b)
