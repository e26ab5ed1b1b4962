"""Importing real trajectory files through the import service: every importer, all or nothing per file."""

from __future__ import annotations

import shutil

import pytest

from experience.importers import read_all
from experience.models import Blob, Step, Trajectory
from experience.services.blobs import blob_get
from experience.services.exporting import export_filters, trajectories_export_to
from experience.services.importing import trajectories_import_file, trajectories_import_path
from tests.experience.importers.fixture_files import (
    ATIF_SAMPLE,
    BROWSER,
    CONVERSATIONS,
    EVAL_ZIP,
    MINI_V2,
    MULTI_SWE,
    PYDICOM,
    RESOLVER,
    SWE_AGENT,
    raw_json,
)

pytestmark = pytest.mark.django_db

ONE_FILE_PER_IMPORTER = [
    pytest.param(PYDICOM, "swe_agent", id="swe_agent"),
    pytest.param(MULTI_SWE, "openhands", id="openhands-output"),
    pytest.param(RESOLVER, "openhands", id="openhands-resolver"),
    pytest.param(BROWSER, "inspect", id="inspect-json"),
    pytest.param(EVAL_ZIP, "inspect", id="inspect-eval"),
    pytest.param(MINI_V2, "mini_swe_agent", id="mini_swe_agent"),
    pytest.param(CONVERSATIONS, "openai_messages", id="openai_messages"),
    pytest.param(ATIF_SAMPLE, "atif", id="atif"),
]


@pytest.mark.parametrize(("path", "fmt"), ONE_FILE_PER_IMPORTER)
def test_each_importer_lands_its_runs_with_steps_outcomes_and_timing(path, fmt):
    expected = read_all(path)

    report = trajectories_import_file(path=path)

    assert (report.status, report.format, report.imported, report.error) == ("imported", fmt, len(expected), "")
    stored = {t.source_ref: t for t in Trajectory.objects.filter(pk__in=report.trajectory_ids)}
    assert len(stored) == len(expected)
    for record in expected:
        trajectory = stored[record.source_ref]
        assert (trajectory.source_format, trajectory.source_version) == (record.source_format, record.source_version)
        assert (trajectory.reward, trajectory.success, trajectory.status) == (record.reward, record.success, record.status)
        assert (trajectory.started_at, trajectory.finished_at) == (record.started_at, record.finished_at)
        steps = list(Step.objects.filter(trajectory=trajectory).order_by("seq").values_list("kind", "started_at"))
        assert steps == [(s.kind, s.started_at) for s in record.steps]
        assert trajectory.n_steps == len(record.steps)
        assert blob_get(trajectory.original_blob) == path.read_bytes()


@pytest.mark.parametrize(("path", "fmt"), ONE_FILE_PER_IMPORTER)
def test_importing_the_same_file_again_adds_nothing(path, fmt):
    first = trajectories_import_file(path=path)
    before = (Trajectory.objects.count(), Step.objects.count(), Blob.objects.count())

    again = trajectories_import_file(path=path)

    assert (again.status, again.imported, again.present) == ("present", 0, first.imported)
    assert sorted(again.trajectory_ids) == sorted(first.trajectory_ids)
    assert (Trajectory.objects.count(), Step.objects.count(), Blob.objects.count()) == before


def test_the_same_file_under_another_name_is_recognised_by_its_content(tmp_path):
    copy = tmp_path / "renamed" / "elsewhere.traj"
    copy.parent.mkdir()
    shutil.copy(PYDICOM, copy)
    trajectories_import_file(path=PYDICOM)

    again = trajectories_import_file(path=copy)

    assert (again.status, again.imported) == ("present", 0)
    assert Trajectory.objects.count() == 1


def test_swe_agent_run_totals_become_the_trajectory_token_counts():
    stats = raw_json(PYDICOM)["info"]["model_stats"]

    report = trajectories_import_file(path=PYDICOM)

    trajectory = Trajectory.objects.get(pk=report.trajectory_ids[0])
    assert (trajectory.tokens_in, trajectory.tokens_out) == (stats["tokens_sent"], stats["tokens_received"])
    assert trajectory.cost == stats["instance_cost"]


@pytest.mark.parametrize("path", [PYDICOM, MULTI_SWE, EVAL_ZIP], ids=["traj", "jsonl", "eval-zip"])
def test_a_truncated_file_writes_nothing_and_says_why(path, tmp_path):
    cut = tmp_path / path.name
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])

    report = trajectories_import_file(path=cut)

    assert report.status in ("invalid", "unrecognised")
    assert path.name in report.error and report.imported == 0
    assert (Trajectory.objects.count(), Step.objects.count(), Blob.objects.count()) == (0, 0, 0)


def test_a_fault_on_the_last_line_takes_the_earlier_runs_of_the_file_with_it(tmp_path):
    lines = MULTI_SWE.read_bytes().splitlines(keepends=True)
    corrupted = tmp_path / "output.jsonl"
    corrupted.write_bytes(b"".join(lines[:-1]) + b'{"instance_id": "x", "history": "not a list"}\n')

    report = trajectories_import_file(path=corrupted)

    assert report.status == "invalid"
    assert "line 3" in report.error and "history" in report.error
    assert Trajectory.objects.count() == 0 and Blob.objects.count() == 0


def test_a_run_over_the_store_limits_fails_its_whole_file(settings):
    settings.TROVE_MAX_STEPS_PER_TRAJECTORY = 50

    report = trajectories_import_file(path=MULTI_SWE)

    assert report.status == "invalid"
    assert "record 0: steps" in report.error and "limit of 50" in report.error
    assert Trajectory.objects.count() == 0


def test_a_directory_is_imported_recursively_and_other_files_are_reported(tmp_path):
    report = trajectories_import_path(path=SWE_AGENT)

    traj_files = sorted(SWE_AGENT.rglob("*.traj"))
    assert report.imported == len(traj_files) == Trajectory.objects.count()
    assert report.count("imported") == len(traj_files)
    unrecognised = [f for f in report.files if f.status == "unrecognised"]
    assert [f.path.rsplit("/", 1)[-1] for f in unrecognised] == ["all_preds.jsonl"]
    assert "format not recognised" in unrecognised[0].error
    refs = set(Trajectory.objects.values_list("source_ref", flat=True))
    assert "swe-agent:trajectories/demonstrations/ctf/pwn/warmup.traj" in refs

    again = trajectories_import_path(path=SWE_AGENT)

    assert (again.imported, again.present) == (0, len(traj_files))


def test_a_forced_format_that_does_not_fit_is_a_clear_error():
    report = trajectories_import_file(path=PYDICOM, format="openhands")

    assert report.status == "invalid" and "pydicom__pydicom-1458.traj" in report.error
    assert Trajectory.objects.count() == 0


def test_a_trove_export_imports_into_an_empty_store_exactly(tmp_path):
    for path in (PYDICOM, MULTI_SWE, EVAL_ZIP, CONVERSATIONS):
        trajectories_import_file(path=path)
    first = tmp_path / "first.jsonl"
    with open(first, "wb") as handle:
        trajectories_export_to(filters=export_filters({}), format="trove", fileobj=handle)
    Trajectory.objects.all().delete()

    report = trajectories_import_file(path=first)
    second = tmp_path / "second.jsonl"
    with open(second, "wb") as handle:
        trajectories_export_to(filters=export_filters({}), format="trove", fileobj=handle)

    assert (report.format, report.imported) == ("trove", 1 + 3 + 4 + 3)
    assert second.read_bytes() == first.read_bytes()
