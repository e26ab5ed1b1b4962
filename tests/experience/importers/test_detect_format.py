"""Format detection over every real fixture and sample, and the error when nothing matches."""

from __future__ import annotations

from pathlib import Path

import pytest

from experience.importers import REGISTRY, ImportFormatError, detect_format, iter_records
from importers.fixture_files import ALL_FILES, ALL_PREDS, EXPECTED_FORMATS, FIXTURES, PYDICOM, label


def test_every_fixture_file_is_listed_with_its_format() -> None:
    on_disk = {p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "SOURCES.md"}
    assert on_disk - set(EXPECTED_FORMATS) == {ALL_PREDS}  # predictions only, no trajectory: see below


@pytest.mark.parametrize("path", ALL_FILES, ids=label)
def test_it_detects_the_format_of_each_fixture(path: Path) -> None:
    assert detect_format(path) == EXPECTED_FORMATS[path]


@pytest.mark.parametrize("path", ALL_FILES, ids=label)
def test_no_other_importer_claims_the_file(path: Path) -> None:
    head = path.read_bytes()[: 1 << 20]
    claims = [key for key, importer in REGISTRY.items() if importer.detect(path, head)]
    assert claims[0] == EXPECTED_FORMATS[path]


def test_a_predictions_file_is_refused_naming_the_file_and_what_was_expected() -> None:
    with pytest.raises(ImportFormatError) as caught:
        detect_format(ALL_PREDS)
    message = str(caught.value)
    assert message.startswith("all_preds.jsonl: format not recognised")
    assert "SWE-agent trajectory (.traj)" in message and "OpenHands output.jsonl" in message
    assert caught.value.path == ALL_PREDS


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "run.jsonl"
    empty.write_bytes(b"\n\n")
    with pytest.raises(ImportFormatError, match=r"^run.jsonl: the file is empty$"):
        detect_format(empty)


def test_an_unknown_format_name_is_refused() -> None:
    with pytest.raises(ImportFormatError, match="unknown format 'langsmith'"):
        list(iter_records(ALL_FILES[0], "langsmith"))


def test_a_renamed_swe_agent_file_is_recognised_by_its_content(tmp_path: Path) -> None:
    renamed = tmp_path / "pydicom__pydicom-1458.json"
    renamed.write_bytes(PYDICOM.read_bytes())
    assert detect_format(renamed) == "swe_agent"
    assert [r.task_key for r in iter_records(renamed)] == ["pydicom__pydicom-1458"]
