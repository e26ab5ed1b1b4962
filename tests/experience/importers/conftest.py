from __future__ import annotations

import pytest

from importers.fixture_files import FIXTURES


@pytest.fixture(scope="session", autouse=True)
def _fixtures_present() -> None:
    if not FIXTURES.is_dir():
        pytest.fail(f"trajectory fixtures not found at {FIXTURES} (set TROVE_SHARED_DIR to the folder holding fixtures/trajectories)")
