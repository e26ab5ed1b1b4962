"""Keeping the full-text search index (StepSearch, Postgres) up to date, off the ingest path.

Why not index at ingest: Postgres spends ~150 µs turning a kilobyte of text into a tsvector, several
times what storing the step costs, so computing it inside the bulk write would cap ingest far below its
target. Instead runs arrive with `search_indexed = false` and `search_index_update` indexes their steps in
batches: run it from a periodic task, after an import, or by hand. Search stays complete meanwhile:
experience.search also scans the steps of runs still waiting (the queue is a partial index, so that scan
is as small as the backlog).

Safe to run concurrently and to repeat: each batch claims its runs with FOR UPDATE SKIP LOCKED, skips
steps that already have a document, and `steps_append` marks a run unindexed again when it grows (under
the same row lock, so an append racing an indexer is picked up by the next pass).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from experience.models import Trajectory

BATCH = 100  # runs per transaction

# What a step's document holds: its preview and inline texts, each capped so one huge inline command cannot
# overflow a tsvector. Path and dotted-name separators become spaces first: the parser would otherwise keep
# `src/pkg/mod.py` or `pkg.mod.func` as one token, and a search for `mod` would miss it. Queries get the same
# treatment (experience.search_hits.tsquery_sql), so a pasted path still matches.
SEPARATORS = "/.:="
STEP_SEARCH_DOCUMENT = (
    "to_tsvector('simple'::regconfig, translate("
    "left(coalesce(preview, ''), 1000) || ' ' || "
    "left(coalesce(payload ->> 'command', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'text', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'output', ''), 20000) || ' ' || "
    "left(coalesce(payload ->> 'response_text', ''), 20000) || ' ' || "
    f"left(coalesce(payload ->> 'tool_calls', ''), 20000), '{SEPARATORS}', '{' ' * len(SEPARATORS)}'))"
)

_INDEX_BATCH = f"""
WITH claimed AS (
    SELECT id FROM experience_trajectory WHERE NOT search_indexed ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
), documents AS (
    INSERT INTO experience_stepsearch (step_id, trajectory_id, document)
    SELECT s.id, s.trajectory_id, {STEP_SEARCH_DOCUMENT}
    FROM experience_step s JOIN claimed c ON s.trajectory_id = c.id
    WHERE NOT EXISTS (SELECT 1 FROM experience_stepsearch x WHERE x.step_id = s.id)
    ON CONFLICT (step_id) DO NOTHING
)
UPDATE experience_trajectory t SET search_indexed = true FROM claimed c WHERE t.id = c.id
"""


def search_index_update(*, limit: int = BATCH) -> int:
    """Index the steps of up to `limit` runs waiting for it, in one transaction. Returns how many runs.

    A no-op (0) on databases without full-text search (SQLite searches by substring instead).
    """
    if connection.vendor != "postgresql":
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_INDEX_BATCH, [limit])
        return cursor.rowcount


def search_index_all(*, batch: int = BATCH, on_batch: Callable[[int], None] | None = None) -> int:
    """Index every run waiting, batch by batch (each its own transaction). Returns how many runs."""
    total = 0
    while done := search_index_update(limit=batch):
        total += done
        if on_batch:
            on_batch(done)
    return total


def search_index_backlog() -> int:
    """How many runs wait to be indexed (0 where search needs no index)."""
    if connection.vendor != "postgresql":
        return 0
    return Trajectory.objects.filter(search_indexed=False).count()
