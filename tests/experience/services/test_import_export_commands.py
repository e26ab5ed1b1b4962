"""`manage.py import` and `manage.py export`: what they write, what they report, how they exit."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from experience.importers import read_all
from experience.models import Trajectory
from tests.experience.importers.fixture_files import FIXTURES, MULTI_SWE, PYDICOM, SWE_TEST_DATA

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, "--no-progress", stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_import_reports_what_it_imported_and_what_it_skipped_and_why():
    output = run("import", str(SWE_TEST_DATA))

    lines = output.splitlines()
    assert sum(line.startswith("imported") for line in lines) == 3
    assert any(line.startswith("skipped") and "all_preds.jsonl: not a trajectory file" in line for line in lines)
    assert lines[-1].startswith("3 runs imported, 0 already present")
    assert Trajectory.objects.count() == 3

    again = run("import", str(SWE_TEST_DATA))

    assert again.splitlines()[-1].startswith("0 runs imported, 3 already present")
    assert sum("already imported (1 runs)" in line for line in again.splitlines()) == 3
    assert Trajectory.objects.count() == 3


def test_import_fails_for_an_invalid_file_and_keeps_nothing_of_it(tmp_path):
    broken = tmp_path / "output.jsonl"
    broken.write_bytes(MULTI_SWE.read_bytes()[:-200])

    with pytest.raises(CommandError) as caught:
        run("import", str(broken), str(PYDICOM))

    assert "output.jsonl line 3" in str(caught.value)
    assert list(Trajectory.objects.values_list("source_format", flat=True)) == ["swe-agent-traj"]


def test_import_as_json_counts_by_status():
    report = json.loads(run("import", str(FIXTURES / "openhands"), "--json"))

    assert report["imported"] == Trajectory.objects.count() == 3 + 2 + 4
    assert report["files_imported"] == 6 and report["files_invalid"] == 0


def test_export_writes_the_selection_to_a_file(tmp_path):
    run("import", str(MULTI_SWE), str(PYDICOM))
    target = tmp_path / "swe.jsonl"

    call_command("export", "--filter", "harness=swe-agent", "-o", str(target), stderr=io.StringIO())

    assert [r.source_ref for r in read_all(target)] == [r.source_ref for r in read_all(PYDICOM)]


def test_export_refuses_an_unknown_filter_by_name():
    with pytest.raises(CommandError) as caught:
        call_command("export", "--filter", "colour=red", stderr=io.StringIO())

    assert "colour" in str(caught.value)
