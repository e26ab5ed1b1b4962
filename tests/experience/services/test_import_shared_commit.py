"""The files of a directory share a commit (FILES_PER_COMMIT), and each is still all or nothing: a bad file among
good ones leaves nothing of itself behind and takes nothing of the others with it."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from experience.importers import read_all
from experience.models import Blob, Trajectory
from experience.services import importing
from tests.experience.importers.fixture_files import MULTI_SWE

pytestmark = pytest.mark.django_db


def folder_with_a_bad_file_between_good_ones(tmp_path):
    lines = MULTI_SWE.read_bytes().splitlines(keepends=True)
    (tmp_path / "a-good.jsonl").write_bytes(lines[0])
    (tmp_path / "b-bad.jsonl").write_bytes(lines[1] + b'{"instance_id": "x", "history": "not a list"}\n')
    (tmp_path / "c-good.jsonl").write_bytes(lines[2])
    return tmp_path


@pytest.mark.parametrize("per_commit", [1, 2, 50])
def test_a_bad_file_in_a_shared_commit_leaves_only_itself_out(tmp_path, monkeypatch, per_commit):
    monkeypatch.setattr(importing, "FILES_PER_COMMIT", per_commit)
    report = importing.trajectories_import_path(path=folder_with_a_bad_file_between_good_ones(tmp_path))

    assert [f.status for f in report.files] == ["imported", "invalid", "imported"]
    stored = set(Trajectory.objects.values_list("task_key", flat=True))
    good = {r.task_key for name in ("a-good.jsonl", "c-good.jsonl") for r in read_all(tmp_path / name)}
    assert stored == good and len(good) == 2
    assert set(Blob.objects.values_list("sha256", flat=True)) >= set(Trajectory.objects.values_list("original_blob", flat=True))
    assert Trajectory.objects.filter(original_blob=importing._original(tmp_path / "b-bad.jsonl")[0]).count() == 0


def test_the_import_command_keeps_the_good_files_and_names_the_bad_one(tmp_path):
    folder = folder_with_a_bad_file_between_good_ones(tmp_path)
    with pytest.raises(CommandError, match="1 file\\(s\\) not imported: b-bad.jsonl line 2"):
        call_command("import", str(folder), "--no-progress", "--no-index", stdout=StringIO())
    assert Trajectory.objects.count() == 2
