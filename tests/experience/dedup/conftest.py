"""Real SWE-agent runs (the shared fixtures, tests/shared_paths.py, see its SOURCES.md) read by the importer."""

from __future__ import annotations

import pytest

from experience.importers.swe_agent import parse
from experience.records import TrajectoryRecord
from tests.shared_paths import FIXTURES_DIR

SWE_AGENT_FIXTURES = FIXTURES_DIR / "swe-agent"
MARSHMALLOW_TASK = "marshmallow-code__marshmallow-1867"


def swe_agent_fixture_records() -> list[TrajectoryRecord]:
    """Every run with at least one action (a run that did nothing says nothing about duplicates)."""
    records = [record for path in sorted(SWE_AGENT_FIXTURES.rglob("*.traj")) for record in parse(path)]
    return [record for record in records if any(step.kind == "command" for step in record.steps)]


@pytest.fixture(scope="session")
def swe_agent_records() -> list[TrajectoryRecord]:
    return swe_agent_fixture_records()
