"""A directory of small files (a session or a trial each) is written a group at a time (importing._import_small),
and the outcome is the one of importing the files one by one: the same statuses, duplicates, present runs and
subagent links, a bad file named and the rest imported. Each test runs twice: with the files written together,
and with every file forced through the file-by-file path (SMALL_FILE_BYTES = -1), which is the reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from experience.models import Blob, Step, Trajectory
from experience.services import importing
from tests.experience.importers.fixture_files import CLAUDE_SESSION, CONVERSATIONS, raw_jsonl

pytestmark = pytest.mark.django_db

TOGETHER, ONE_BY_ONE = "together", "one by one"


@pytest.fixture(params=[TOGETHER, ONE_BY_ONE])
def mode(request, monkeypatch):
    if request.param == ONE_BY_ONE:
        monkeypatch.setattr(importing, "SMALL_FILE_BYTES", -1)
    return request.param


def conversation(index: int) -> dict:
    row = raw_jsonl(CONVERSATIONS)[0]
    row["task_id"], row["id"] = f"task-{index}", f"run-{index}"
    row["messages"][1]["content"] = f"Task {index}: make tests/test_{index}.py pass."
    return row


def write_rows(path: Path, *rows: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def statuses(report) -> dict[str, str]:
    return {Path(f.path).name: f.status for f in report.files}


@pytest.fixture
def one_by_one(monkeypatch) -> list[str]:
    """The files imported through the file-by-file path (trajectories_import_file), by name."""
    names: list[str] = []
    real = importing.trajectories_import_file

    def watched(**kwargs):
        names.append(Path(kwargs["path"]).name)
        return real(**kwargs)

    monkeypatch.setattr(importing, "trajectories_import_file", watched)
    return names


def test_a_session_and_its_subagent_s_own_file_are_written_together_and_linked(tmp_path, mode, one_by_one):
    write_rows(tmp_path / "a" / "runs.jsonl", conversation(1))
    session = tmp_path / "e" / CLAUDE_SESSION.name  # its subagent's own file yields the subagent's run again
    shutil.copytree(CLAUDE_SESSION.parent, session.parent)
    subagent = session.with_suffix("") / "subagents" / "agent-a9e41c07.jsonl"

    report = importing.trajectories_import_path(path=tmp_path)

    assert [(Path(f.path), f.status) for f in report.files] == [
        (tmp_path / "a" / "runs.jsonl", "imported"), (subagent, "imported"), (session, "imported")]
    assert (report.files[2].imported, report.files[2].present) == (1, 1)  # the subagent came with its own file
    assert report.files[2].trajectory_ids[1] == report.files[1].trajectory_ids[0]
    assert len(one_by_one) == (0 if mode == TOGETHER else 3)
    main = Trajectory.objects.get(harness="claude-code", metadata__has_key="subagent_source_refs")
    child = Trajectory.objects.get(source_ref=main.metadata["subagent_source_refs"][0])
    assert child.metadata["parent_source_ref"] == main.source_ref
    assert (main.original_blob, child.original_blob) == (importing._original(session)[0],
                                                         importing._original(subagent)[0])  # each its own file
    assert {main.original_blob, child.original_blob} <= set(Blob.objects.values_list("sha256", flat=True))
    assert Trajectory.objects.count() == 3


def test_files_that_repeat_an_earlier_file_of_their_group_get_the_one_by_one_outcome(tmp_path, mode):
    first = write_rows(tmp_path / "a" / "runs.jsonl", conversation(1))
    shutil.copy(first, tmp_path / "b-same-bytes.jsonl")
    write_rows(tmp_path / "c-same-run-other-ref.jsonl", {**conversation(1), "id": "run-1-copy"})
    write_rows(tmp_path / "d-twin-and-new.jsonl", conversation(1), conversation(2))

    report = importing.trajectories_import_path(path=tmp_path)

    assert [f.status for f in report.files] == ["imported", "present", "duplicate", "imported"]
    (run_1,) = report.files[0].trajectory_ids
    assert report.files[1].trajectory_ids == [run_1]
    assert [d["duplicate_of"] for d in report.files[2].duplicates] == [run_1]
    assert (report.files[3].imported, [d["duplicate_of"] for d in report.files[3].duplicates]) == (1, [run_1])
    assert sorted(Trajectory.objects.values_list("task_key", flat=True)) == ["task-1", "task-2"]


def test_a_file_that_changes_a_run_an_earlier_file_of_the_group_wrote_is_reported_as_changed(tmp_path, mode):
    lines = CLAUDE_SESSION.read_text().splitlines(keepends=True)
    write_rows(tmp_path / "a" / "notes.jsonl")  # an empty file first: the session files are not the first
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / CLAUDE_SESSION.name).write_text("".join(lines))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / CLAUDE_SESSION.name).write_text("".join(lines[:-1]))  # the same session, a step fewer

    report = importing.trajectories_import_path(path=tmp_path)

    assert [f.status for f in report.files][1:] == ["imported", "changed"]
    (changed,) = report.files[2].changed
    assert changed["trajectory_id"] == report.files[1].trajectory_ids[0] and "steps" in changed["differs"]
    assert Trajectory.objects.count() == 1


def test_a_file_the_store_refuses_is_named_and_the_others_of_its_group_are_imported(tmp_path, mode, settings):
    write_rows(tmp_path / "a.jsonl", conversation(1))
    big = conversation(2)
    big["messages"] += [{"role": "user", "content": f"and {n}"} for n in range(40)]
    write_rows(tmp_path / "b-too-long.jsonl", big)
    write_rows(tmp_path / "c.jsonl", conversation(3))
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = 30

    report = importing.trajectories_import_path(path=tmp_path)

    assert statuses(report) == {"a.jsonl": "imported", "b-too-long.jsonl": "invalid", "c.jsonl": "imported"}
    assert "steps" in report.files[1].error and "exceeds the limit of 30" in report.files[1].error
    assert set(Trajectory.objects.values_list("task_key", flat=True)) == {"task-1", "task-3"}
    assert not Trajectory.objects.filter(original_blob=importing._original(tmp_path / "b-too-long.jsonl")[0]).exists()


def test_small_files_cost_no_query_per_file(tmp_path):
    def queries_to_import(count: int, folder: Path) -> int:
        for index in range(count):
            write_rows(folder / f"run-{index:03d}.jsonl", conversation(index + 1000 * count))
        with CaptureQueriesContext(connection) as queries:
            report = importing.trajectories_import_path(path=folder)
        assert report.count("imported") == count
        return len(queries)

    five, forty = queries_to_import(5, tmp_path / "five"), queries_to_import(40, tmp_path / "forty")
    # not one query more per file (file by file it is about 20 a file); on Postgres exactly the same count, on
    # SQLite bulk inserts are split by the rows' number of parameters
    assert forty - five < 35
    if connection.vendor == "postgresql":
        assert forty == five
    assert Trajectory.objects.count() == 45 and Step.objects.filter(trajectory__task_key="task-40039").exists()
