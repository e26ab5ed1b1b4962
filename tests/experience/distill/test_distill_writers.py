import gzip
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distill_factories import careful_fix, source_run
from isal import isal_zlib

from experience.distill.errors import RowShapeError
from experience.distill.schemas import MESSAGE, schema_for_kind
from experience.distill.spec import DatasetSpec
from experience.distill.values import value_rows
from experience.distill.writers import (
    GZIP_LEVEL,
    ParquetRowWriter,
    RowEncoder,
    _as_is_sizer,
    _compile,
    conform_row,
    encode_row,
    write_jsonl_gz,
    write_parquet,
)

ROWS = 200_000
# Holding 200k of these rows in a list takes well over 100 MB; a streaming writer needs a row group.
PEAK_BOUND = 32 * 1024 * 1024


def small_rows(count):
    for n in range(count):
        yield {
            "kind": "outcome",
            "trajectory_id": f"t{n}",
            "task_key": f"task-{n % 97}",
            "outcome": n % 3 == 0,
        }


def traced_peak(write):
    tracemalloc.start()
    try:
        result = write()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.mark.slow
def test_jsonl_writer_streams_200k_rows_in_bounded_memory(tmp_path):
    path = tmp_path / "rows.jsonl.gz"

    result, peak = traced_peak(lambda: write_jsonl_gz(small_rows(ROWS), path))

    print(f"jsonl.gz: {ROWS} rows, {result.bytes} bytes, traced peak {peak / 2**20:.1f} MiB")
    assert result.rows == ROWS
    assert peak < PEAK_BOUND
    with gzip.open(path, "rt") as handle:
        lines = handle.readlines()
    assert len(lines) == ROWS
    assert json.loads(lines[3]) == {
        "kind": "outcome",
        "outcome": True,
        "task_key": "task-3",
        "trajectory_id": "t3",
    }


@pytest.mark.slow
def test_parquet_writer_streams_200k_rows_in_bounded_memory_a_row_group_at_a_time(tmp_path):
    path = tmp_path / "rows.parquet"

    result, peak = traced_peak(lambda: write_parquet(small_rows(ROWS), path, row_group_rows=20_000))

    print(f"parquet: {ROWS} rows, {result.bytes} bytes, traced peak {peak / 2**20:.1f} MiB")
    assert result.rows == ROWS
    assert peak < PEAK_BOUND
    metadata = pq.ParquetFile(path).metadata
    assert (metadata.num_rows, metadata.num_row_groups) == (ROWS, 10)
    table = pq.read_table(path, columns=["trajectory_id", "outcome"])
    assert table.slice(3, 1).to_pylist() == [{"trajectory_id": "t3", "outcome": True}]


def test_jsonl_output_is_byte_identical_for_the_same_rows(tmp_path):
    write_jsonl_gz(small_rows(100), tmp_path / "a.jsonl.gz")
    write_jsonl_gz(small_rows(100), tmp_path / "b.jsonl.gz")

    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_value_rows_fit_the_declared_schema_and_read_back(tmp_path):
    rows = list(value_rows([source_run("r1", careful_fix())], DatasetSpec(kind="value")))
    path = tmp_path / "value.parquet"

    result = write_parquet(iter(rows), path, schema=schema_for_kind("value"))
    table = pq.read_table(path)

    assert result.rows == len(rows) == table.num_rows
    assert table.schema.equals(schema_for_kind("value"))
    back = table.to_pylist()[6]
    assert back["target_value"] == rows[6]["target_value"]
    assert back["rubric"] == rows[6]["rubric"]
    assert [m["content"] for m in back["messages"]] == [m["content"] for m in rows[6]["messages"]]


def test_tool_calls_are_stored_as_json_text_and_unknown_fields_are_refused(tmp_path):
    schema = pa.schema([("messages", schema_for_kind("value").field("messages").type)])
    calls = [{"id": "1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    path = tmp_path / "m.parquet"

    write_parquet(
        [{"messages": [{"role": "assistant", "content": "", "tool_calls": calls}]}], path, schema=schema
    )
    stored = pq.read_table(path).to_pylist()[0]["messages"][0]

    assert json.loads(stored["tool_calls"]) == calls
    with pytest.raises(RowShapeError, match="surprise"):
        ParquetRowWriter(tmp_path / "x.parquet", schema=schema).write({"messages": [], "surprise": 1})


def test_an_empty_stream_with_a_declared_schema_still_writes_a_readable_file(tmp_path):
    result = write_parquet(iter([]), tmp_path / "empty.parquet", schema=schema_for_kind("sft"))

    assert result.rows == 0
    assert pq.read_table(tmp_path / "empty.parquet").schema.equals(schema_for_kind("sft"))


def _rows_sharing_messages():
    """Value-shaped rows as a run makes them: growing contexts sharing message dicts, a context that is
    not an extension, a null list, and text JSON must escape."""
    task = {"role": "user", "content": 'Fix it: naïve “dates” \x1f\n\t\\ "quoted"'}
    context, rows = [{"role": "system", "content": "s"}, task], []
    for n in range(6):
        context = context + [
            {"role": "assistant", "content": f"step {n}"},
            {"role": "user", "content": "x" * n},
        ]
        rows.append({"kind": "value", "step_index": n + 1, "target_value": 0.95 ** (6 - n), "messages": context,
                     "action": {"role": "assistant", "content": f"step {n}"}, "rubric": {"edited_source": n > 2}})  # fmt: skip
    rows.append(rows[-1] | {"messages": [context[0], context[-1]]})
    rows.append(rows[-1] | {"messages": None})
    return rows


def test_the_row_encoder_gives_each_row_its_canonical_json_when_rows_share_messages():
    encoder = RowEncoder()

    for row in _rows_sharing_messages():
        line = encoder.encode(row)

        assert line == encode_row(row)
        assert line.decode() == json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_the_row_encoder_sees_a_list_that_grew_in_place():
    encoder = RowEncoder()
    messages = [{"role": "user", "content": "a"}]
    first = encoder.encode({"messages": messages})
    messages.append({"role": "assistant", "content": "b"})

    assert first == b'{"messages":[{"content":"a","role":"user"}]}'
    assert encoder.encode({"messages": messages}) == encode_row({"messages": messages})


def test_the_jsonl_file_is_a_standard_gzip_stream_made_by_isa_l_at_the_fast_level(tmp_path):
    write_jsonl_gz(small_rows(10), tmp_path / "a.jsonl.gz")
    data = (tmp_path / "a.jsonl.gz").read_bytes()
    lines = b"".join(encode_row(row) + b"\n" for row in small_rows(10))

    assert gzip.decompress(data) == lines
    assert data[4:8] == b"\0\0\0\0"  # mtime 0: the same rows give the same bytes
    deflate = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, -15)
    assert data[10:-8] == deflate.compress(lines) + deflate.flush()  # header and trailer aside
    assert GZIP_LEVEL == 2


def test_parquet_rows_sharing_messages_are_stored_as_the_schema_fits_them_row_by_row(tmp_path):
    schema = pa.schema(
        [("kind", pa.string()), ("step_index", pa.int32()), ("target_value", pa.float64()),
         ("messages", schema_for_kind("value").field("messages").type),
         ("action", schema_for_kind("value").field("action").type),
         ("rubric", pa.struct([("edited_source", pa.bool_()), ("verified_fix", pa.bool_())]))]
    )  # fmt: skip
    rows = _rows_sharing_messages()
    rows[2] = rows[2] | {"action": {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}}

    write_parquet(iter(rows), tmp_path / "rows.parquet", schema=schema, row_group_rows=3)
    stored = pq.read_table(tmp_path / "rows.parquet")

    assert (
        stored.num_rows == len(rows)
        and pq.ParquetFile(tmp_path / "rows.parquet").metadata.num_row_groups == 3
    )
    row_by_row = pa.Table.from_pylist([conform_row(row, schema) for row in rows], schema=schema)
    assert stored.to_pylist() == row_by_row.to_pylist()
    assert stored.to_pylist()[2]["action"]["tool_calls"] == '[{"id": "1"}]'
    assert stored.to_pylist()[-1]["messages"] is None
    with pytest.raises(RowShapeError, match=r"row.rubric: fields the schema does not declare: surprise"):
        ParquetRowWriter(tmp_path / "x.parquet", schema=schema).write(
            rows[0] | {"rubric": {"surprise": True}}
        )


def test_messages_taken_as_they_are_and_converted_ones_are_stored_alike_and_checked_alike(tmp_path):
    schema = pa.schema([("messages", schema_for_kind("value").field("messages").type)])
    calls = [{"id": "1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": "plain text, taken as it is"},
        {"role": "assistant", "content": None, "tool_calls": calls},  # JSON: converted to text
        {"role": "tool", "content": "ok", "tool_call_id": "1", "weight": 0},
        {"role": "assistant", "content": ["parts"]},  # not text: converted
    ]
    rows = [{"messages": messages[: n + 1]} for n in range(len(messages))]

    write_parquet(iter(rows), tmp_path / "m.parquet", schema=schema)

    row_by_row = pa.Table.from_pylist([conform_row(row, schema) for row in rows], schema=schema)
    assert pq.read_table(tmp_path / "m.parquet").to_pylist() == row_by_row.to_pylist()
    with pytest.raises(RowShapeError, match=r"row.messages\[\]: fields the schema does not declare: mood"):
        ParquetRowWriter(tmp_path / "x.parquet", schema=schema).write(
            {"messages": [messages[0], {"role": "user", "content": "hi", "mood": "calm"}]}
        )
    with pytest.raises(RowShapeError, match=r"row.messages\[\]: expected an object, got str"):
        ParquetRowWriter(tmp_path / "y.parquet", schema=schema).write({"messages": ["hi"]})


def test_a_message_taken_as_it_is_counts_the_text_size_its_conversion_would():
    # Row groups are cut by this size: the same rows must make the same groups either way.
    size_as_is = _as_is_sizer(MESSAGE)
    convert = _compile(MESSAGE, "m")
    plain = [
        {"role": "user", "content": "héllo"},
        {"role": "tool", "content": "", "name": None},
        {"weight": 1},
    ]
    converted = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}, {"content": 3}]

    for message in plain:
        counted = [0]
        convert(message, counted)
        assert size_as_is(message) == counted[0]
    assert [size_as_is(message) for message in converted] == [None, None]
    assert size_as_is({"role": "user", "extra": "x"}) is None


def test_message_text_is_written_as_a_dictionary_and_reads_back_as_the_declared_strings(tmp_path):
    schema = schema_for_kind("value")
    rows = list(value_rows([source_run("r1", careful_fix())], DatasetSpec(kind="value")))
    assert len(rows) > 2

    write_parquet(iter(rows), tmp_path / "rows.parquet", schema=schema)
    stored = pq.read_table(tmp_path / "rows.parquet")

    assert stored.schema.equals(schema)  # strings, not dictionaries: the Arrow schema is not stored
    assert pq.read_schema(tmp_path / "rows.parquet").metadata is None
    row_by_row = pa.Table.from_pylist([conform_row(row, schema) for row in rows], schema=schema)
    assert stored.to_pylist() == row_by_row.to_pylist()
    names = [message["name"] for row in stored.to_pylist() for message in row["messages"]]
    assert names and all(name is None for name in names)  # nulls survive as null indices
    columns = pq.ParquetFile(tmp_path / "rows.parquet").metadata.row_group(0)
    content = next(
        columns.column(i)
        for i in range(columns.num_columns)
        if columns.column(i).path_in_schema.endswith("content")
        and columns.column(i).path_in_schema.startswith("messages")
    )
    assert content.dictionary_page_offset is not None and "RLE_DICTIONARY" in content.encodings
