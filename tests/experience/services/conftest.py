"""Fixtures shared by the store's service tests."""

from __future__ import annotations

import pytest
from django.db import connection

from experience.services import dataset_source


@pytest.fixture
def step_reads(monkeypatch):
    """The run ids whose steps the read path fetched, one list per `_step_rows` call."""
    calls: list[list[int]] = []
    real = dataset_source._step_rows

    def watched(trajectory_ids):
        calls.append(list(trajectory_ids))
        return real(trajectory_ids)

    monkeypatch.setattr(dataset_source, "_step_rows", watched)
    return calls


@pytest.fixture
def digests_dataset_dir(settings, tmp_path):
    """Datasets built under tmp_path, on Postgres (where run digests are kept)."""
    assert connection.vendor == "postgresql", "digests are kept on Postgres only"
    settings.TROVE_DATASET_DIR = tmp_path / "datasets"
    return settings.TROVE_DATASET_DIR
