"""Keeps the embedded store's FTS5 step index (migration 0014) alive across later migrations.

On SQLite, Django alters a column by remaking the table: it creates `new__experience_step`, copies the rows,
drops the old table and renames the new one. Dropping the old table drops its triggers with it, so the
search index would silently stop following inserts, edits and deletes. After every `migrate` (post_migrate),
this re-creates any missing trigger and refills the index from the steps, which also picks up rows written
between the remake and now. Idempotent; a no-op on Postgres, when the triggers are all there, and before
migration 0014 has made the index (or after it was migrated back).

The statements are migration 0014's own; a migration that changes the index's text must point
FTS_MIGRATION at itself.
"""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any

from django.db import connections, transaction

log = logging.getLogger(__name__)
FTS_MIGRATION = "experience.migrations.0014_step_fts_sqlite"
FTS_TABLE = "experience_step_fts"
# FTS5's command for emptying a contentless index (a plain DELETE is refused on one).
_EMPTY = f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}) VALUES ('delete-all')"


_TRIGGER_NAME = re.compile(r"CREATE TRIGGER (\w+)")


def fts_trigger_names() -> list[str]:
    """The triggers migration 0014 creates, by name."""
    return [match.group(1) for sql in _definitions().TRIGGERS if (match := _TRIGGER_NAME.search(sql))]


def fts_triggers_missing(*, using: str = "default") -> list[str]:
    """The index's triggers that the step table lacks (empty on Postgres or without the index)."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT type, name FROM sqlite_master WHERE name = %s OR type = 'trigger'", [FTS_TABLE])
        found = {(kind, name) for kind, name in cursor.fetchall()}
    if ("table", FTS_TABLE) not in found:
        return []
    return [name for name in fts_trigger_names() if ("trigger", name) not in found]


def fts_triggers_ensure(*, using: str = "default") -> list[str]:
    """Re-create the index's triggers if any is missing, and refill the index; the names that were missing."""
    missing = fts_triggers_missing(using=using)
    if not missing:
        return []
    definitions = _definitions()
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        for statement in [*definitions.DROP_TRIGGERS, *definitions.TRIGGERS, _EMPTY, definitions.FILL]:
            cursor.execute(statement)
    log.warning("the FTS5 step index lost its triggers %s (a migration remade experience_step); re-created them "
                "and refilled the index", ", ".join(missing))
    return missing


def fts_triggers_after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate receiver (connected in ExperienceConfig.ready)."""
    fts_triggers_ensure(using=using)


def _definitions():
    return importlib.import_module(FTS_MIGRATION)
