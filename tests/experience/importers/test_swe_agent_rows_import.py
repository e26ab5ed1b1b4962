"""SWE-agent rows of published datasets (nebius/SWE-agent-trajectories' schema) as JSONL, a JSON array and
Parquet: the same runs from each, commands from the ai turns with the next user turn as output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experience.importers import ImportFormatError, ImportValidationError, detect_format, read_all
from importers.fixture_files import ADP_RAW, SWE_AGENT_ROWS, raw_json, raw_jsonl


def _as_parquet(tmp_path: Path) -> Path:
    path = tmp_path / "train-00000-of-00001.parquet"
    rows = raw_jsonl(SWE_AGENT_ROWS)
    for row in rows:  # a Parquet column has one type: the dataset's is bool
        row["target"] = str(row["target"]) == "True"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _as_array(tmp_path: Path) -> Path:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(raw_jsonl(SWE_AGENT_ROWS), indent=2))
    return path


def _view(records: list) -> list:
    return [(r.task_key, r.model, r.success, r.reward, r.final_diff,
             [(s.kind, s.text, s.command, s.output, s.response_text) for s in r.steps]) for r in records]


def test_jsonl_array_and_parquet_give_the_same_runs(tmp_path: Path) -> None:
    paths = [SWE_AGENT_ROWS, _as_array(tmp_path), _as_parquet(tmp_path)]
    assert [detect_format(p) for p in paths] == ["swe_agent_rows"] * 3
    jsonl, array, parquet = (_view(read_all(p)) for p in paths)
    assert jsonl == array == parquet


def test_target_as_bool_or_text_is_the_outcome_and_the_patch_the_diff() -> None:
    first, second = read_all(SWE_AGENT_ROWS)
    raw = raw_jsonl(SWE_AGENT_ROWS)
    assert (first.success, first.reward, second.success, second.reward) == (True, 1.0, False, 0.0)
    assert first.final_diff == raw[0]["generated_patch"] and second.final_diff == ""
    assert first.metadata["exit_status"] == "submitted" and first.metadata["eval_logs"] == raw[0]["eval_logs"]
    assert first.source_ref.endswith("#django__django-11099@swe-agent-llama-70b")


def test_commands_and_outputs_are_the_source_turns_byte_for_byte() -> None:
    record = read_all(SWE_AGENT_ROWS)[0]
    turns = raw_jsonl(SWE_AGENT_ROWS)[0]["trajectory"]
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.command for c in commands] == [
        'find_file "validators.py" django/contrib/auth', "open django/contrib/auth/validators.py",
        "edit 10:10\n    regex = r'\\A[\\w.@+-]+\\Z'\nend_of_edit", "submit"]
    assert [c.output for c in commands] == [turns[3]["text"], turns[5]["text"], turns[7]["text"], None]
    assert "\x1b[0m" in commands[1].output  # control characters of the terminal are kept as they were
    calls = [s for s in record.steps if s.kind == "model_call"]
    assert [c.response_text for c in calls] == [t["text"] for t in turns if t["role"] == "ai"]
    assert [m.role for m in calls[1].request_messages] == ["system", "user", "assistant", "user"]
    assert record.instruction == turns[1]["text"]


def test_an_ai_turn_without_a_command_leaves_the_next_user_turn_a_message() -> None:
    record = read_all(SWE_AGENT_ROWS)[1]
    assert [s.kind for s in record.steps][:4] == ["message", "message", "model_call", "message"]
    assert record.steps[3].text.startswith("Your output was not formatted correctly.")


def test_a_row_with_a_bad_role_is_named(tmp_path: Path) -> None:
    rows = raw_jsonl(SWE_AGENT_ROWS)
    rows[1]["trajectory"][2]["role"] = "robot"
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ImportValidationError, match=r"rows.jsonl line 2: field 'trajectory\[2\].role' must be one"):
        read_all(path)


def test_a_cut_parquet_file_is_refused_naming_it(tmp_path: Path) -> None:
    whole = _as_parquet(tmp_path).read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImportFormatError, match=r"^cut.parquet: "):
        read_all(cut, "swe_agent_rows")


def test_a_published_row_reads_with_its_system_prompt_and_commands_byte_for_byte() -> None:
    [record] = read_all(ADP_RAW)
    [row] = raw_json(ADP_RAW)
    turns = row["trajectory"]
    assert detect_format(ADP_RAW) == "swe_agent_rows"
    assert (record.task_key, record.model, record.success, record.reward) == (
        "marshmallow-code__apispec-382", "swe-agent-llama-70b", False, 0.0)
    assert record.steps[0].text == turns[0]["system_prompt"] and turns[0]["text"] is None
    assert record.instruction == turns[1]["text"]  # its \r\n kept
    commands = [s for s in record.steps if s.kind == "command"]
    assert [c.command for c in commands] == ['search_dir "paths" src', "ls -F", 'search_dir "paths" apispec']
    assert [c.output for c in commands] == [turns[3]["text"], turns[5]["text"], turns[7]["text"]]
    assert [s.response_text for s in record.steps if s.kind == "model_call"] == [turns[i]["text"] for i in (2, 4, 6)]
