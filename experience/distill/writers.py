"""Streamed writers: rows go to disk as they come, never gathered in memory.

`RowEncoder` turns a row into its canonical JSON (sorted keys, compact, UTF-8 as is; orjson, whose bytes are
those of `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)` except for some floats
under 1e-4, same value, other spelling: 0.00001 for 1e-05, 1e-7 for 1e-07), encoding each distinct message
object once: a run's value rows share their context messages, so encoding every row whole would be quadratic
in the run's length. The same bytes are the JSONL line and what the manifest's row digest hashes.

`JsonlGzWriter` writes one JSON object per line as a standard gzip stream (mtime 0, so the same rows give
the same bytes) made by ISA-L's igzip (python-isal) at level 2, in the writing thread. The trade-off, on
the value rows of a 100,000-step store (~600 MB of JSON): zlib level 6 took ~6 CPU-s for a 41x smaller
file; igzip level 2 takes ~0.5 s for a 14x smaller one (igzip level 3: ~3 s, 35x; zlib-ng level 1:
~1.1 s, 8x). The JSONL is there to be read anywhere with `gzip`; the compact format is the Parquet file
(zstd), about a quarter of the JSONL's size.

`ParquetRowWriter` buffers at most one row group (`row_group_rows` rows, or `max_batch_bytes` of text,
whichever comes first) before handing it to pyarrow's ParquetWriter (on a thread of its own: pyarrow lets
go of the GIL while it encodes and compresses); message lists are built as Arrow columns from the distinct
messages of the group and their positions (text fields as dictionary arrays), not message by message, and a
message that is already what the
schema stores (declared fields, text where text goes) is handed to pyarrow as it is. Both writers are
also usable row by row, so one pass over the data can feed several files (a split each, JSONL and
Parquet) — see `build.distill`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from isal import igzip

from experience.distill.chat import extends
from experience.distill.errors import RowShapeError

Row = Mapping[str, Any]
DEFAULT_ROW_GROUP_ROWS = 10_000
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
# A row group's distinct message texts fit well within this (the group's text is capped at
# DEFAULT_MAX_BATCH_BYTES); past it Parquet would fall back to writing every copy in full.
_DICTIONARY_PAGE_BYTES = 64 * 1024 * 1024
GZIP_LEVEL = 2  # ISA-L's levels run 0 to 3; see the module docstring
_CHUNK_BYTES = 1024 * 1024
_SORTED = orjson.OPT_SORT_KEYS
# Messages an encoder remembers before it starts afresh: far more than one run's context holds.
_REMEMBERED = 4096


@dataclass(frozen=True)
class WriteResult:
    path: str
    rows: int
    bytes: int
    sha256: str = ""  # of the file's bytes, once someone has read them (`build.distill_shard` does)


def encode_row(row: Row) -> bytes:
    """A row's canonical JSON as UTF-8 bytes: sorted keys, compact, non-ASCII kept as is."""
    return orjson.dumps(row, option=_SORTED)


class RowEncoder:
    """`encode_row` with each distinct message (a dict in a top-level list of dicts) encoded once.

    Messages are remembered by identity, holding a reference so the identity is not reused while it is
    remembered: a message dict must not change once a row holding it has been encoded (rows are written
    as they are made, and the row makers build new dicts rather than editing shared ones). A list that
    starts with the previous row's list (a run's growing context) reuses that list's encoding.
    """

    def __init__(self) -> None:
        self._fragments: dict[int, tuple[Any, bytes]] = {}
        self._last: dict[str, tuple[tuple[Any, ...], bytes]] = {}  # per key: the last list and its JSON

    def encode(self, row: Row) -> bytes:
        spliced = dict(row)
        for key, value in row.items():
            if type(value) is list and value and type(value[0]) is dict:
                spliced[key] = orjson.Fragment(self._list(key, value))
        return orjson.dumps(spliced, option=_SORTED)

    def _list(self, key: str, messages: list[Any]) -> bytes:
        last = self._last.get(key)
        if last is not None and extends(messages, last[0]):
            previous, encoded = last
            added = messages[len(previous) :]
            if added:
                # One copy of the grown list: a run's contexts are long, and `a + b + c` copies each time.
                fragments = b",".join(map(self._fragment, added))
                encoded = b"".join((memoryview(encoded)[:-1], b",", fragments, b"]"))
        else:
            encoded = b"[" + b",".join(map(self._fragment, messages)) + b"]"
        self._last[key] = (tuple(messages), encoded)
        return encoded

    def _fragment(self, message: Any) -> bytes:
        known = self._fragments.get(id(message))
        if known is not None:
            return known[1]
        if len(self._fragments) >= _REMEMBERED:
            self._fragments.clear()
        # A compact copy: orjson's own bytes keep a 4 KiB buffer however short the text.
        encoded = memoryview(orjson.dumps(message, option=_SORTED)).tobytes()
        self._fragments[id(message)] = (message, encoded)
        return encoded


class JsonlGzWriter:
    def __init__(self, path: str | os.PathLike[str], *, compresslevel: int = GZIP_LEVEL) -> None:
        self.path = Path(path)
        self.rows = 0
        # A bytearray, not a list of lines: orjson's bytes keep a 4 KiB buffer each while they live.
        self._pending = bytearray()
        self._encoder = RowEncoder()
        self._file: BinaryIO = open(self.path, "wb")
        self._gzip = igzip.IGzipFile(
            filename="", mode="wb", fileobj=self._file, mtime=0, compresslevel=compresslevel
        )

    def write(self, row: Row) -> None:
        self.write_line(self._encoder.encode(row))

    def write_line(self, line: bytes) -> None:
        """One row already encoded (`RowEncoder.encode`), without its newline."""
        # Lines are gathered into ~1 MiB chunks: one gzip call per line costs more than the JSON. The
        # chunks end where the lines make them, so the same rows give the same stream.
        self._pending += line
        self._pending += b"\n"
        self.rows += 1
        if len(self._pending) >= _CHUNK_BYTES:
            self._drain()

    def _drain(self) -> None:
        if self._pending:
            self._gzip.write(self._pending)
            self._pending = bytearray()

    def close(self) -> WriteResult:
        """Finish the gzip stream and close; idempotent."""
        if not self._gzip.closed:
            try:
                self._drain()
            finally:
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
    inferred from the first row group and later groups must match it.

    With a schema, each list-of-struct column (a row's messages) is kept as the group's distinct items
    (by identity, as `RowEncoder` does) and per row the positions of its items: each distinct message is
    converted once, and the column is built by Arrow, not item by item. Its text fields go to Parquet as
    dictionary arrays (the group's distinct values, and per message an index): Parquet dictionary-encodes
    text columns anyway, and handing it the dictionary spares it hashing every copy of a context (a value
    set repeats each message in every later row of its run: ~600 MB of text per 100,000 steps, where the
    distinct messages are a few MB). The file is an ordinary Parquet file whose text columns read back as
    strings: the Arrow schema is not stored in it, so readers see the declared types, not dictionaries."""

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
        # pyarrow lets go of the GIL while it encodes and compresses a row group: a thread of its own
        # writes one while this one gathers the next (one in flight at most).
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-write")
        self._in_flight: Future[None] | None = None
        self._lists: dict[str, _ItemListColumn] = {}
        self._rest_schema = schema
        if schema is not None:
            self._lists = {
                field.name: _ItemListColumn(field.type, field.name)
                for field in schema
                if pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type)
            }
            self._rest_schema = pa.schema([field for field in schema if field.name not in self._lists])
        self._convert = _row_converter(self._rest_schema) if self._rest_schema is not None else None
        self._check = _row_checker(schema) if schema is not None else None

    def write(self, row: Row) -> None:
        self._batch.append(dict(row))
        if self._check is not None:
            # Checked now, converted (only if pyarrow refuses it as it is) a row group at a time.
            size = self._check(row)
            for name, column in self._lists.items():
                size += column.add(row.get(name))
            self._batch_bytes += size
        else:
            self._batch_bytes += approximate_size(row)
        self.rows += 1
        if len(self._batch) >= self._row_group_rows or self._batch_bytes >= self._max_batch_bytes:
            self._flush()

    def close(self) -> WriteResult:
        """Flush and close; idempotent (a second call returns the first result)."""
        if self._result is not None:
            return self._result
        try:
            self._flush()
            self._wait()
        finally:
            self._encoder.shutdown(wait=True)
        if self._writer is None and self._schema is not None:
            self._writer = self._open(self._schema)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        size = self.path.stat().st_size if self.path.exists() else 0
        self._result = WriteResult(str(self.path), self.rows, size)
        return self._result

    def _flush(self) -> None:
        if not self._batch:
            return
        table = self._rest_table()
        if self._lists and self._schema is not None:
            columns = {name: column.take_all() for name, column in self._lists.items()}
            table = pa.Table.from_arrays(
                [columns[f.name] if f.name in columns else table[f.name] for f in self._schema],
                schema=_with_dictionary_text(self._schema, self._lists),
            )
        if self._writer is None:
            if self._schema is None:
                self._schema = table.schema
            self._writer = self._open(self._schema)
        self._wait()
        self._in_flight = self._encoder.submit(
            self._writer.write_table, table, row_group_size=len(self._batch)
        )
        self._batch = []
        self._batch_bytes = 0

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter:
        return _parquet_writer(self.path, schema, self._lists)

    def _wait(self) -> None:
        if self._in_flight is not None:
            self._in_flight.result()
            self._in_flight = None

    def _rest_table(self) -> pa.Table:
        """The group's columns but the item lists: the rows as they are when pyarrow takes them (the
        usual case), else fitted to the schema first (JSON values in text fields)."""
        try:
            return pa.Table.from_pylist(self._batch, schema=self._rest_schema)
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            if self._convert is None:
                raise
            rests = ({k: v for k, v in row.items() if k not in self._lists} for row in self._batch)
            return pa.Table.from_pylist(
                [self._convert(rest, [0]) for rest in rests], schema=self._rest_schema
            )

    def __enter__(self) -> ParquetRowWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _ItemListColumn:
    """A list-of-struct column of one row group: its distinct items, converted once each, and per row
    the items' positions, turned into an Arrow ListArray by `take_all` (which starts the next group).

    The usual item (a message of declared text fields holding text) is kept as it is, since pyarrow
    reads it as the converter would write it: only other items go through the converter."""

    def __init__(self, type_: pa.ListType, name: str) -> None:
        self._type = type_
        self._convert = _compile(type_.value_type, f"row.{name}[]")
        self._as_is_size = _as_is_sizer(type_.value_type)
        self._where = f"row.{name}"
        self._clear()

    def _clear(self) -> None:
        self._items: list[Any] = []  # converted, in order of first use
        self._known: dict[int, tuple[Any, int, int]] = {}  # id -> (the item, its position, its size)
        self._positions: list[int] = []
        self._offsets: list[int] = [0]
        self._nulls: list[bool] = []
        # The last row's list, its items' positions and their size: a run's next context starts with it.
        self._last: tuple[tuple[Any, ...], list[int], int] = ((), [], 0)

    def add(self, value: Any) -> int:
        """One row's list (None for null); returns its text size."""
        if value is None:
            self._nulls.append(True)
            self._offsets.append(len(self._positions))
            return 0
        if not isinstance(value, list | tuple):
            raise RowShapeError(f"{self._where}: expected a list, got {type(value).__name__}")
        previous, positions, text = self._last
        if extends(value, previous):
            positions, added = list(positions), value[len(previous) :]
        else:
            positions, added, text = [], value, 0
        known = self._known
        for item in added:
            seen = known.get(id(item))
            if seen is None:
                seen = known[id(item)] = (item, len(self._items), self._keep(item))
            positions.append(seen[1])
            text += seen[2]
        self._last = (tuple(value), positions, text)
        self._positions.extend(positions)
        self._nulls.append(False)
        self._offsets.append(len(self._positions))
        return text + 8

    def _keep(self, item: Any) -> int:
        """Add a distinct item to the group's items; returns its text size."""
        size = self._as_is_size(item)
        if size is not None:
            self._items.append(item)
            return size
        counted = [0]
        self._items.append(self._convert(item, counted))
        return counted[0]

    def take_all(self) -> pa.Array:
        """The group's column: a list of the items at each row's positions, text fields as dictionary
        arrays over the distinct items' values (`_dictionary_struct`)."""
        items = pa.array(self._items, type=self._type.value_type)
        positions = pa.array(self._positions, type=pa.int32())
        values = _dictionary_struct(items, positions)
        mask = pa.array(self._nulls, type=pa.bool_()) if any(self._nulls) else None
        column = pa.ListArray.from_arrays(pa.array(self._offsets, type=pa.int32()), values, mask=mask)
        self._clear()
        return column


def _dictionary_struct(items: pa.StructArray, positions: pa.Array) -> pa.StructArray:
    """items.take(positions) with each text field a dictionary array (its distinct values once, and an
    index per position) rather than a copy of the text at every position. Nulls stay in the indices:
    Parquet takes no null inside a dictionary."""
    children = []
    for index in range(items.type.num_fields):
        child = items.field(index)
        if pa.types.is_string(child.type):
            encoded = child.dictionary_encode()
            child = pa.DictionaryArray.from_arrays(encoded.indices.take(positions), encoded.dictionary)
        else:
            child = child.take(positions)
        children.append(child)
    struct_type = _dictionary_text_struct(items.type)
    return pa.StructArray.from_arrays(
        children, fields=list(struct_type), mask=items.is_null().take(positions)
    )


def _dictionary_text_struct(type_: pa.StructType) -> pa.StructType:
    return pa.struct(
        [
            pa.field(field.name, pa.dictionary(pa.int32(), field.type), field.nullable)
            if pa.types.is_string(field.type)
            else field
            for field in type_
        ]
    )


def _parquet_writer(path: Path, schema: pa.Schema, lists: Collection[str]) -> pq.ParquetWriter:
    """pyarrow's writer for a file of this schema, whose item-list columns (`lists`) are written with their
    text fields as dictionaries."""
    if not lists:
        return pq.ParquetWriter(path, schema, compression="zstd")
    return pq.ParquetWriter(
        path,
        _with_dictionary_text(schema, lists),
        compression="zstd",
        store_schema=False,  # so the dictionary columns read back as the strings they hold
        dictionary_pagesize_limit=_DICTIONARY_PAGE_BYTES,
    )


def _with_dictionary_text(schema: pa.Schema, lists: Collection[str]) -> pa.Schema:
    """The schema Arrow writes: the item-list columns with their text fields as dictionaries."""
    return pa.schema(
        [
            pa.field(field.name, pa.list_(_dictionary_text_struct(field.type.value_type)), field.nullable)
            if field.name in lists
            else field
            for field in schema
        ]
    )


def _as_is_sizer(type_: pa.DataType) -> Callable[[Any], int | None]:
    """For a struct of text and scalar fields: a function giving the text size (as its converter counts
    it) of an item that needs no conversion (a dict of declared fields whose text fields hold text or
    None), else None. For other types, a function that always says None."""
    fields = [type_.field(i) for i in range(type_.num_fields)] if pa.types.is_struct(type_) else []
    if not fields or any(pa.types.is_nested(field.type) for field in fields):
        return lambda item: None
    declared = {field.name for field in fields}
    texts = {field.name for field in fields if pa.types.is_string(field.type)}
    # The converter counts 8 for the struct and 8 for each scalar field, present or not.
    fixed = 8 + 8 * (len(fields) - len(texts))

    def as_is_size(item: Any) -> int | None:
        if type(item) is not dict or not item.keys() <= declared:
            return None
        size = fixed
        for name, value in item.items():
            if name in texts:
                if type(value) is str:
                    size += len(value)
                elif value is not None:
                    return None  # JSON to store as text
        return size

    return as_is_size


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


def _row_checker(schema: pa.Schema) -> Callable[[Row], int]:
    """A check of a row's shape against the schema (objects where structs are, no undeclared field, at
    any depth) that returns the row's approximate text size: what `_compile`'s converters check, without
    building a converted copy of the row."""
    fields = list(schema)
    # Lists of structs are checked as their item columns are built (_ItemListColumn).
    nested = [(f.name, _checker(f.type, f"row.{f.name}")) for f in fields if pa.types.is_struct(f.type)]
    return _object_checker(fields, nested, "row")


def _has_struct(type_: pa.DataType) -> bool:
    return pa.types.is_struct(type_) or (pa.types.is_list(type_) and _has_struct(type_.value_type))


def _checker(type_: pa.DataType, where: str) -> Callable[[Any], int]:
    """Checks a value of a struct type (or a list of them) and returns its approximate text size."""
    if pa.types.is_list(type_):
        item = _checker(type_.value_type, where)
        return lambda value: sum(item(element) for element in value if element is not None) + 8
    fields = [type_.field(i) for i in range(type_.num_fields)]
    nested = [(f.name, _checker(f.type, f"{where}.{f.name}")) for f in fields if _has_struct(f.type)]
    return _object_checker(fields, nested, where)


def _object_checker(
    fields: list[pa.Field], nested: list[tuple[str, Callable[[Any], int]]], where: str
) -> Callable[[Any], int]:
    """Checks an object's fields (and its nested structs) and returns its approximate text size: 8 per
    field plus the length of its text fields' text. (Text in any other field is refused by pyarrow when
    the row group is made, so only text fields are read.)"""
    known = {field.name for field in fields}
    texts = [field.name for field in fields if pa.types.is_string(field.type)]

    def check(value: Any) -> int:
        if type(value) is not dict or not value.keys() <= known:
            _check_object(value, known, where)  # raises, unless another Mapping
        size = 8 * len(value)
        for name in texts:
            element = value.get(name)
            if type(element) is str:
                size += len(element)
        for name, inner in nested:
            element = value.get(name)
            if element is not None:
                size += inner(element)
        return size

    return check


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
    if all(convert is _convert_scalar for _, convert in fields):
        return _flat_struct_converter(known, where)

    def convert_struct(value: Any, size: list[int]) -> Any:
        if value is None:
            return None
        _check_object(value, known, where)
        size[0] += 8
        return {name: convert(value.get(name), size) for name, convert in fields}

    return convert_struct


def _check_object(value: Any, known: set[str], where: str) -> None:
    if not isinstance(value, Mapping):
        raise RowShapeError(f"{where}: expected an object, got {type(value).__name__}")
    if not known.issuperset(value):
        unknown = ", ".join(sorted(set(value) - known))
        raise RowShapeError(f"{where}: fields the schema does not declare: {unknown}")


def _flat_struct_converter(known: set[str], where: str) -> Converter:
    """A struct of scalars only (flags, counts) needs no conversion: checked, then passed on as it is
    (pyarrow reads a missing field as null, as the general converter makes it)."""
    fixed_size = 8 * (len(known) + 1)

    def convert_flat(value: Any, size: list[int]) -> Any:
        if value is None:
            return None
        _check_object(value, known, where)
        size[0] += fixed_size
        return value

    return convert_flat


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
