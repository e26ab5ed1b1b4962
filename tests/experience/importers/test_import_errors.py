"""Truncated, corrupted and malformed files raise typed errors that name the file, line, record and field."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest

from experience.errors import ValidationError
from experience.exporters import trove_jsonl
from experience.importers import (
    ImportFormatError,
    ImportValidationError,
    TrajectoryImportError,
    iter_records,
    read_all,
    validate_file,
)
from importers.fixture_files import (
    ALL_FILES,
    ATIF_SAMPLE,
    BROWSER,
    EVAL_ZIP,
    EXPECTED_FORMATS,
    MINI_V1,
    MULTI_SWE,
    PYDICOM,
    label,
)


def copy_to(tmp_path: Path, source: Path, data: bytes) -> Path:
    target = tmp_path / source.parent.name / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


@pytest.mark.parametrize("path", ALL_FILES, ids=label)
def test_the_first_half_of_a_file_raises_a_format_error_naming_it(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes()
    cut = copy_to(tmp_path, path, data[: len(data) // 2])
    with pytest.raises(ImportFormatError) as caught:
        read_all(cut)
    assert str(caught.value).startswith(path.name)
    assert caught.value.path == cut
    assert "truncated" in str(caught.value) or "not a readable zip" in str(caught.value)


@pytest.mark.parametrize("path", ALL_FILES, ids=label)
def test_garbage_in_the_middle_raises_a_typed_error_naming_the_file(path: Path, tmp_path: Path) -> None:
    data = path.read_bytes()
    third = len(data) // 3
    broken = copy_to(tmp_path, path, data[:third] + b'"}]}{\xff\xfe not json ' + data[third + 24 :])
    with pytest.raises(TrajectoryImportError) as caught:
        read_all(broken)
    assert str(caught.value).startswith(path.name)


def test_a_missing_history_names_the_line_and_field(tmp_path: Path) -> None:
    lines = MULTI_SWE.read_bytes().splitlines()
    third = json.loads(lines[2])
    del third["history"]
    path = tmp_path / "output.jsonl"
    path.write_bytes(b"\n".join([lines[0], lines[1], json.dumps(third).encode()]) + b"\n")
    with pytest.raises(ImportValidationError) as caught:
        read_all(path, "openhands")
    assert str(caught.value) == "output.jsonl line 3: field 'history' missing"
    assert (caught.value.line, caught.value.record, caught.value.field) == (3, 2, "history")
    assert isinstance(caught.value, ValidationError)  # the API's exception handler answers it with a 400


def test_a_field_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    raw = json.loads(MINI_V1.read_bytes())
    raw["messages"] = "none"
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(
        ImportValidationError, match=r"^run.traj.json: field 'messages' must be a list, got str$"
    ):
        read_all(path)


def test_a_trajectory_entry_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    raw = json.loads(PYDICOM.read_bytes())
    raw["trajectory"][2] = "create x.py"
    path = tmp_path / "run.traj"
    path.write_text(json.dumps(raw))
    with pytest.raises(ImportValidationError, match=r"^run.traj: field 'trajectory\[2\]' must be an object$"):
        read_all(path)


def test_an_inspect_sample_without_id_is_named(tmp_path: Path) -> None:
    raw = json.loads(BROWSER.read_bytes())
    del raw["samples"][0]["id"]
    path = tmp_path / "log.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ImportValidationError, match=r"^log.json record 0: field 'samples\[0\].id' missing$"):
        read_all(path)


def test_an_eval_archive_with_a_damaged_member_is_refused(tmp_path: Path) -> None:
    data = bytearray(EVAL_ZIP.read_bytes())
    with zipfile.ZipFile(EVAL_ZIP) as archive:
        member = archive.getinfo("samples/2_epoch_1.json")
    data[member.header_offset + 30 + len(member.filename) + 10] ^= 0xFF  # inside the compressed bytes
    path = copy_to(tmp_path, EVAL_ZIP, bytes(data))
    with pytest.raises(
        ImportFormatError, match=r"^log_streaming.eval record 2: samples/2_epoch_1.json: cannot be read"
    ):
        read_all(path)


def test_a_file_that_only_looks_like_a_zip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.eval"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(ImportFormatError, match=r"^run.eval: not a readable zip archive"):
        read_all(path)


def test_an_atif_step_from_an_unknown_source_is_named(tmp_path: Path) -> None:
    raw = json.loads(ATIF_SAMPLE.read_bytes())
    raw["steps"][3]["source"] = "tool"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(raw, indent=2))
    with pytest.raises(
        ImportValidationError, match=r"^t.json: field 'steps\[3\].source' 'tool' is not one of"
    ):
        read_all(path)


def test_a_trove_line_with_an_unknown_step_kind_is_named(tmp_path: Path) -> None:
    record = next(iter_records(PYDICOM))
    data = trove_jsonl.record_to_dict(record)
    data["steps"][4]["kind"] = "shell"
    path = tmp_path / "export.jsonl"
    path.write_text(trove_jsonl.dumps(record) + "\n" + json.dumps(data) + "\n")
    with pytest.raises(
        ImportValidationError, match=r"^export.jsonl record 1: field 'steps\[4\].kind' 'shell' is not"
    ):
        read_all(path)


def test_a_trove_line_missing_a_field_is_named(tmp_path: Path) -> None:
    data = trove_jsonl.record_to_dict(next(iter_records(PYDICOM)))
    del data["steps"][0]["exit_code"]
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(
        ImportValidationError, match=r"^export.jsonl line 1: field 'steps\[0\].exit_code' missing$"
    ):
        read_all(path)


def test_a_stream_yields_earlier_runs_before_a_later_fault_but_validate_file_refuses_up_front(
    tmp_path: Path,
) -> None:
    lines = MULTI_SWE.read_bytes().splitlines()
    path = tmp_path / "output.jsonl"
    path.write_bytes(lines[0] + b"\n" + lines[1] + b"\n" + lines[2][: len(lines[2]) // 2])
    stream = iter_records(path)
    assert next(stream).task_key == "ponylang__ponyc-4595"
    with pytest.raises(ImportFormatError, match=r"^output.jsonl line 3: invalid JSON"):
        validate_file(path)
    with pytest.raises(ImportFormatError):
        read_all(path)


JSON_FILES = [p for p in ALL_FILES if p.suffix != ".eval"]
ODD_VALUES = [None, 0, -1, 1.5, True, "", "x", [], {}, [1], {"a": 1}, "2025-13-45T99:00"]


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:20]):
            found += _paths(item, (*prefix, index))
    return found


@pytest.mark.parametrize("path", JSON_FILES, ids=label)
def test_odd_values_anywhere_raise_only_typed_errors(path: Path, tmp_path: Path) -> None:
    rng = random.Random(path.name)
    jsonl = path.suffix == ".jsonl"
    documents = (
        [json.loads(line, strict=False) for line in path.read_bytes().splitlines() if line.strip()]  # raw controls
        if jsonl
        else [json.loads(path.read_bytes())]
    )
    places = [(i, p) for i, d in enumerate(documents) for p in _paths(d)]
    target = tmp_path / path.name
    for _ in range(12):
        copy = json.loads(json.dumps(documents))
        index, place = rng.choice(places)
        holder = copy[index]
        for key in place[:-1]:
            holder = holder[key]
        holder[place[-1]] = rng.choice(ODD_VALUES)
        target.write_text("\n".join(json.dumps(d) for d in copy) if jsonl else json.dumps(copy[0], indent=1))
        try:
            read_all(target, EXPECTED_FORMATS[path])
        except TrajectoryImportError as error:
            assert str(error).startswith(path.name)
