"""Real SWE-agent runs as `TrajectoryRecord`s, for the dedup tests.

Uses `experience.importers.swe_agent.parse` when it exists; until then a minimal local reading of the
.traj JSON (each `trajectory[].action` a command step, the task from the file's instance id, the first
non-demonstration user message as the instruction, `info.submission` as the final diff).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from experience.records import StepRecord, TrajectoryRecord

SWE_AGENT_FIXTURES = Path("/work/shared/fixtures/trajectories/swe-agent")
MARSHMALLOW_TASK = "marshmallow-code__marshmallow-1867"


def load_traj(path: Path) -> list[TrajectoryRecord]:
    try:
        from experience.importers.swe_agent import parse
    except ImportError:
        return list(_read_traj(path))
    return list(parse(path))


def _read_traj(path: Path) -> Iterator[TrajectoryRecord]:
    data = json.loads(path.read_text())
    steps = [
        StepRecord(kind="command", command=entry["action"], output=entry.get("observation", ""))
        for entry in data.get("trajectory", [])
    ]
    yield TrajectoryRecord(
        source="import",
        source_format="swe-agent-traj",
        source_ref=str(path.relative_to(SWE_AGENT_FIXTURES)),
        task_key=path.stem,
        instruction=_first_task_message(data.get("history", [])),
        final_diff=data.get("info", {}).get("submission") or "",
        steps=steps,
    )


def _first_task_message(history: list[dict]) -> str:
    for message in history:
        if message.get("role") == "user" and not message.get("is_demo"):
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def all_fixture_records() -> list[TrajectoryRecord]:
    records = [record for path in sorted(SWE_AGENT_FIXTURES.rglob("*.traj")) for record in load_traj(path)]
    return [record for record in records if record.steps]  # a run that did nothing says nothing about dedup


@pytest.fixture(scope="session")
def swe_agent_records() -> list[TrajectoryRecord]:
    return all_fixture_records()
