"""Bulk writes: Postgres COPY through Django's own connection, with the ORM as the fallback elsewhere.

COPY runs on the psycopg connection under Django's cursor, so it joins the caller's `transaction.atomic`
block: an error rolls it back with everything else. Values are written in COPY's text format; JSON
columns take JSON text, which callers serialise once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Model


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def copy_rows(
    table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, types: Sequence[str] | None = None
) -> None:
    """COPY rows into `table` (Postgres only). The caller holds the transaction.

    With `types` (each column's Postgres type, exactly: int4 is not int8) the rows go in COPY's binary
    format: no escaping on either side, and bytea is sent as it is rather than as hex text of twice the size.
    """
    statement = f"COPY {_quote(table)} ({', '.join(_quote(c) for c in columns)}) FROM STDIN"
    if types is not None:
        statement += " (FORMAT BINARY)"
    # wrap_database_errors: a unique violation arrives as Django's IntegrityError, as from the ORM.
    with connection.cursor() as cursor, connection.wrap_database_errors:
        with cursor.connection.cursor() as raw, raw.copy(statement) as copy:
            if types is not None:
                copy.set_types(list(types))
            for row in rows:
                copy.write_row(row)


def copy_ignoring_conflicts(
    table: str,
    columns: Sequence[str],
    rows: Callable[[], Iterable[Sequence[Any]]],
    *,
    conflict: str,
    types: Sequence[str] | None = None,
) -> None:
    """COPY rows that are new as far as the caller knows; if a concurrent writer stored one of them
    meanwhile, redo it as INSERT … ON CONFLICT DO NOTHING (Postgres only; the caller holds the transaction).

    `rows` makes the rows (lazily, so making them overlaps the COPY); it is called again for the redo. The
    fast path is a plain COPY (in a savepoint): conflicts are rare, since the caller has just checked which
    rows exist, and only a writer racing on the same content causes one.
    """
    try:
        with transaction.atomic():
            copy_rows(table, columns, rows(), types=types)
    except IntegrityError:
        copy_then_insert_ignoring_conflicts(table, columns, rows(), conflict=conflict, types=types)


def copy_then_insert_ignoring_conflicts(
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    conflict: str,
    types: Sequence[str] | None = None,
) -> None:
    """COPY into a temporary table, then INSERT … ON CONFLICT DO NOTHING into `table` (Postgres only).

    For content-addressed rows that a concurrent writer may store at the same moment: a plain COPY would
    fail on the unique key, while ON CONFLICT waits for the other writer and keeps its row.
    """
    staging = f"trove_staging_{table}"
    cols = ", ".join(_quote(c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_quote(staging)} "
            f"(LIKE {_quote(table)} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        cursor.execute(f"TRUNCATE {_quote(staging)}")
    copy_rows(staging, columns, rows, types=types)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_quote(table)} ({cols}) SELECT {cols} FROM {_quote(staging)} "
            f"ORDER BY {_quote(conflict)} ON CONFLICT ({_quote(conflict)}) DO NOTHING"
        )


def copy_new_objects(objects: Sequence[Model]) -> None:
    """Insert new model instances with COPY (Postgres only; the caller holds the transaction), setting their
    primary keys: ids are taken from the table's sequence in one query, then every concrete column is
    written as Django would write it (field defaults and auto_now / auto_now_add applied by the fields)."""
    if not objects:
        return
    meta = objects[0]._meta
    fields = list(meta.concrete_fields)
    ids = next_ids(meta.db_table, str(meta.pk.column), len(objects))
    for obj, pk in zip(objects, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias

    def row(obj: Model) -> list[Any]:
        return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]

    copy_rows(meta.db_table, [str(f.column) for f in fields], (row(obj) for obj in objects))


def next_ids(table: str, column: str, n: int) -> list[int]:
    """`n` fresh primary keys from the table's sequence, in one query (Postgres only), for rows written with
    COPY whose ids are needed before they are written."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)", [table, column, n]
        )
        return [row[0] for row in cursor.fetchall()]


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)
