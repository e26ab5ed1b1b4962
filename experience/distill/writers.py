"""Streamed writers: rows go to disk as they come, never gathered in memory.

`JsonlGzWriter` writes one JSON object per line through gzip (mtime 0 and sorted keys, so the same rows
give the same bytes). `ParquetRowWriter` buffers at most one row group (`row_group_rows` rows, or
`max_batch_bytes` of text, whichever comes first) before handing it to pyarrow's ParquetWriter. Both are
also usable row by row, so one pass over the data can feed several files (a split each, JSONL and
Parquet) — see `build.distill`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from experience.distill.errors import RowShapeError

Row = Mapping[str, Any]
DEFAULT_ROW_GROUP_ROWS = 10_000
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
_CHUNK_CHARS = 256 * 1024


@dataclass(frozen=True)
class WriteResult:
    path: str
    rows: int
    bytes: int


def dumps_row(row: Row) -> str:
    """A row's canonical JSON: sorted keys, compact, UTF-8 kept as is."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class JsonlGzWriter:
    def __init__(self, path: str | os.PathLike[str], *, compresslevel: int = 6) -> None:
        self.path = Path(path)
        self.rows = 0
        self._pending: list[str] = []
        self._pending_chars = 0
        self._file: BinaryIO = open(self.path, "wb")
        self._gzip = gzip.GzipFile(
            filename="", mode="wb", fileobj=self._file, mtime=0, compresslevel=compresslevel
        )

    def write(self, row: Row) -> None:
        # Lines are gathered into ~256 KiB chunks: one gzip call per line costs more than the JSON.
        line = dumps_row(row) + "\n"
        self._pending.append(line)
        self._pending_chars += len(line)
        self.rows += 1
        if self._pending_chars >= _CHUNK_CHARS:
            self._drain()

    def _drain(self) -> None:
        if self._pending:
            self._gzip.write("".join(self._pending).encode("utf-8"))
            self._pending = []
            self._pending_chars = 0

    def close(self) -> WriteResult:
        """Finish the gzip stream and close; idempotent."""
        if not self._gzip.closed:
            self._drain()
            self._gzip.close()
            self._file.close()
        return WriteResult(str(self.path), self.rows, self.path.stat().st_size)

    def __enter__(self) -> JsonlGzWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ParquetRowWriter:
    """Rows to Parquet, a row group at a time. With `schema`, rows are fitted to it (missing fields become
    null, JSON values stored as strings, unknown fields raise `RowShapeError`); without one, the schema is
    inferred from the first row group and later groups must match it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | None = None,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        self.path = Path(path)
        self.rows = 0
        self._schema = schema
        self._row_group_rows = row_group_rows
        self._max_batch_bytes = max_batch_bytes
        self._batch: list[dict[str, Any]] = []
        self._batch_bytes = 0
        self._writer: pq.ParquetWriter | None = None
        self._result: WriteResult | None = None
        self._convert = _row_converter(schema) if schema is not None else None

    def write(self, row: Row) -> None:
        if self._convert is not None:
            size = [0]
            self._batch.append(self._convert(row, size))
            self._batch_bytes += size[0]
        else:
            self._batch.append(dict(row))
            self._batch_bytes += approximate_size(row)
        self.rows += 1
        if len(self._batch) >= self._row_group_rows or self._batch_bytes >= self._max_batch_bytes:
            self._flush()

    def close(self) -> WriteResult:
        """Flush and close; idempotent (a second call returns the first result)."""
        if self._result is not None:
            return self._result
        self._flush()
        if self._writer is None and self._schema is not None:
            self._writer = pq.ParquetWriter(self.path, self._schema, compression="zstd")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        size = self.path.stat().st_size if self.path.exists() else 0
        self._result = WriteResult(str(self.path), self.rows, size)
        return self._result

    def _flush(self) -> None:
        if not self._batch:
            return
        table = pa.Table.from_pylist(self._batch, schema=self._schema)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        self._writer.write_table(table, row_group_size=len(self._batch))
        self._batch = []
        self._batch_bytes = 0

    def __enter__(self) -> ParquetRowWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def write_jsonl_gz(rows: Iterable[Row], path: str | os.PathLike[str]) -> WriteResult:
    """Stream rows to a gzip JSONL file; returns the path, row count and file size."""
    with JsonlGzWriter(path) as writer:
        for row in rows:
            writer.write(row)
    return writer.close()


def write_parquet(
    rows: Iterable[Row],
    path: str | os.PathLike[str],
    *,
    schema: pa.Schema | None = None,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> WriteResult:
    """Stream rows to a Parquet file, one row group per `row_group_rows` rows."""
    with ParquetRowWriter(path, schema=schema, row_group_rows=row_group_rows) as writer:
        for row in rows:
            writer.write(row)
    return writer.close()


Converter = Callable[[Any, list[int]], Any]


def conform_row(row: Row, schema: pa.Schema) -> dict[str, Any]:
    """A row fitted to the schema (see `ParquetRowWriter`)."""
    return _row_converter(schema)(row, [0])


def _row_converter(schema: pa.Schema) -> Converter:
    return _compile(pa.struct(list(schema)), "row")


def _compile(type_: pa.DataType, where: str) -> Converter:
    """A converter for one Arrow type, built once per writer: rows are many, types are few. Each converter
    also adds the text size it saw to `size[0]`, so batching costs no second pass over the row."""
    if pa.types.is_struct(type_):
        return _struct_converter(type_, where)
    if pa.types.is_list(type_):
        item = _compile(type_.value_type, where)

        def convert_list(value: Any, size: list[int]) -> Any:
            if value is None:
                return None
            size[0] += 8
            return [item(element, size) for element in value]

        return convert_list
    if pa.types.is_string(type_):
        return _convert_string
    return _convert_scalar


def _struct_converter(type_: pa.StructType, where: str) -> Converter:
    fields = [
        (type_.field(i).name, _compile(type_.field(i).type, f"{where}.{type_.field(i).name}"))
        for i in range(type_.num_fields)
    ]
    known = {name for name, _ in fields}

    def convert_struct(value: Any, size: list[int]) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise RowShapeError(f"{where}: expected an object, got {type(value).__name__}")
        if not known.issuperset(value):
            unknown = ", ".join(sorted(set(value) - known))
            raise RowShapeError(f"{where}: fields the schema does not declare: {unknown}")
        size[0] += 8
        return {name: convert(value.get(name), size) for name, convert in fields}

    return convert_struct


def _convert_string(value: Any, size: list[int]) -> Any:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    size[0] += len(text)
    return text


def _convert_scalar(value: Any, size: list[int]) -> Any:
    size[0] += 8
    return value


def approximate_size(value: Any) -> int:
    """Rough in-memory text size of a row (string lengths plus 8 bytes per scalar)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(approximate_size(item) for item in value.values()) + 8
    if isinstance(value, list | tuple):
        return sum(approximate_size(item) for item in value) + 8
    return 8
