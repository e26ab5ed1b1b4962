import gzip
import json
import threading
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distill_factories import careful_fix, source_run

from experience.distill.errors import RowShapeError
from experience.distill.schemas import schema_for_kind
from experience.distill.spec import DatasetSpec
from experience.distill.values import value_rows
from experience.distill.writers import (
    ParquetRowWriter,
    RowEncoder,
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


def test_the_jsonl_writer_compresses_on_its_own_thread_at_level_6(tmp_path, monkeypatch):
    threads = set()
    real_write = gzip.GzipFile.write

    def watched(self, data):
        threads.add(threading.current_thread().name)
        return real_write(self, data)

    monkeypatch.setattr(gzip.GzipFile, "write", watched)
    write_jsonl_gz(small_rows(10), tmp_path / "a.jsonl.gz")

    header = (tmp_path / "a.jsonl.gz").read_bytes()[:10]
    assert header[8] == 0  # XFL 0: neither the fastest (1) nor the slowest (9) level: 6, see GZIP_LEVEL
    assert {name.split("_")[0] for name in threads} == {"jsonl-gzip"}


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
