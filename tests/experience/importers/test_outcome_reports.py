"""SWE-bench evaluation reports and outcome files label runs: among imported files (the runs of that import)
and through `manage.py outcomes` (runs already stored), each change a curation event naming the report."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from experience.importers import reports
from experience.models import CurationEvent, Trajectory
from experience.services.importing import trajectories_import_file, trajectories_import_path
from importers.fixture_files import (
    CONVERSATIONS,
    SWE_AGENT_ROWS,
    SWE_BENCH_INSTANCE,
    SWE_BENCH_SUMMARY,
    raw_jsonl,
)

pytestmark = pytest.mark.django_db


def _unlabelled_rows(folder: Path) -> Path:
    """The sample rows without their outcome, plus the django instance run by a second model."""
    rows = raw_jsonl(SWE_AGENT_ROWS)
    other = json.loads(json.dumps(rows[0]))
    other["model_name"] = "swe-agent-llama-8b"
    other["trajectory"] = other["trajectory"][:4]
    for row in (*rows, other):
        row.pop("target")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (*rows, other)))
    return path


def _outcomes() -> dict[tuple[str, str], tuple]:
    return {(t.task_key, t.model): (t.success, t.reward) for t in Trajectory.objects.all()}


def test_the_report_kinds_are_detected_and_read() -> None:
    assert reports.detect(SWE_BENCH_SUMMARY) == reports.SWE_BENCH_SUMMARY
    assert reports.detect(SWE_BENCH_INSTANCE) == reports.SWE_BENCH_INSTANCE
    assert reports.detect(CONVERSATIONS) is None
    labels = reports.read_labels(SWE_BENCH_SUMMARY)
    assert [(lb.target.task_key, lb.success) for lb in labels] == [
        ("django__django-11099", True), ("astropy__astropy-12907", False), ("psf__requests-2317", False),
        ("sympy__sympy-20590", None)]
    assert {"swe-agent-llama-70b", "nebius-eval"} <= labels[0].names
    [instance] = reports.read_labels(SWE_BENCH_INSTANCE)
    assert (instance.target.task_key, instance.success, instance.names) == (
        "django__django-11099", True, frozenset({"nebius-eval", "swe-agent-llama-70b"}))


def test_a_summary_among_imported_files_labels_the_runs_it_names_by_instance_and_model(tmp_path: Path) -> None:
    _unlabelled_rows(tmp_path / "run")
    shutil.copy(SWE_BENCH_SUMMARY, tmp_path / "run" / SWE_BENCH_SUMMARY.name)

    report = trajectories_import_path(path=tmp_path / "run")

    [summary] = [f for f in report.files if f.status == "report"]
    assert _outcomes() == {("django__django-11099", "swe-agent-llama-70b"): (True, 1.0),
                           ("astropy__astropy-12907", "swe-agent-llama-8b"): (False, 0.0),
                           ("django__django-11099", "swe-agent-llama-8b"): (None, None)}
    labels = summary.labels
    assert (labels["labelled"], labels["resolved"], labels["unresolved"], labels["not_mentioned"]) == (2, 1, 1, 1)
    assert labels["unmatched"] == ["psf__requests-2317"] and labels["not_judged"] == ["sympy__sympy-20590"]
    events = CurationEvent.objects.filter(action="set_outcome")
    assert sorted(e.reason for e in events) == [f"outcomes from {tmp_path / 'run' / SWE_BENCH_SUMMARY.name}: "
                                                f"{verdict}" for verdict in ("resolved", "unresolved")]


def test_a_per_instance_report_in_logs_labels_through_the_command(tmp_path: Path) -> None:
    rows = _unlabelled_rows(tmp_path / "traj")
    logs = tmp_path / "traj" / "logs"
    shutil.copytree(SWE_BENCH_INSTANCE.parents[4], logs)
    out = StringIO()

    call_command("import", str(rows.parent), "--no-progress", "--no-index", stdout=out)

    assert _outcomes()[("django__django-11099", "swe-agent-llama-70b")] == (True, 1.0)
    assert _outcomes()[("django__django-11099", "swe-agent-llama-8b")] == (None, None)
    assert "report    " in out.getvalue() and "1 run(s) labelled (1 resolved, 0 unresolved; 1 changed" in out.getvalue()


def test_outcomes_labels_stored_runs_from_a_jsonl_and_every_change_is_a_curation_event(tmp_path: Path) -> None:
    ids = trajectories_import_file(path=CONVERSATIONS).trajectory_ids
    first = Trajectory.objects.get(pk=ids[0])
    path = tmp_path / "verdicts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in [
        {"source_ref": first.source_ref, "reward": 0.0},
        {"trajectory_id": ids[1], "success": True},
        {"task_key": "count-lines", "score": 1},
        {"task_key": "no-such-task", "reward": 1},
    ]))
    out = StringIO()

    call_command("outcomes", str(path), stdout=out)

    assert [Trajectory.objects.get(pk=i).success for i in ids] == [False, True, True]
    assert [Trajectory.objects.get(pk=i).reward for i in ids] == [0.0, 0.0, 1.0]
    events = CurationEvent.objects.filter(trajectory_id=ids[0])
    assert [(e.before, e.after, e.reason) for e in events] == [
        ({"reward": 1.0, "success": True}, {"reward": 0.0, "success": False}, f"outcomes from {path}: unresolved")]
    assert "1 id(s) matched no run: no-such-task" in out.getvalue()


def test_outcomes_dry_run_counts_what_would_change_and_changes_nothing(tmp_path: Path) -> None:
    trajectories_import_file(path=_unlabelled_rows(tmp_path / "rows"))
    out = StringIO()
    call_command("outcomes", str(SWE_BENCH_SUMMARY), "--dry-run", "--filter", "model=swe-agent-llama-8b", stdout=out)
    assert "2 run(s) labelled (1 resolved, 1 unresolved; 2 changed" in out.getvalue()
    assert "(dry run: nothing changed)" in out.getvalue()
    assert set(_outcomes().values()) == {(None, None)} and not CurationEvent.objects.exists()


def test_outcomes_filters_narrow_the_runs_and_a_run_of_no_match_fails(tmp_path: Path) -> None:
    trajectories_import_file(path=_unlabelled_rows(tmp_path / "rows"))
    call_command("outcomes", str(SWE_BENCH_SUMMARY), "--filter", "model=swe-agent-llama-8b", stdout=StringIO())
    assert _outcomes() == {("django__django-11099", "swe-agent-llama-70b"): (None, None),
                           ("astropy__astropy-12907", "swe-agent-llama-8b"): (False, 0.0),
                           ("django__django-11099", "swe-agent-llama-8b"): (True, 1.0)}
    with pytest.raises(CommandError, match="no report matched any run in the store"):
        call_command("outcomes", str(SWE_BENCH_SUMMARY), "--filter", "model=nobody", stdout=StringIO())


def test_outcomes_refuses_what_is_not_a_report(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not an evaluation report"):
        call_command("outcomes", str(CONVERSATIONS), stdout=StringIO())
    with pytest.raises(CommandError, match="--filter colour: not a filter"):
        call_command("outcomes", str(SWE_BENCH_SUMMARY), "--filter", "colour=red", stdout=StringIO())
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match="no evaluation report found"):
        call_command("outcomes", str(tmp_path / "empty"), stdout=StringIO())


def test_labelling_again_changes_nothing_and_records_nothing(tmp_path: Path) -> None:
    trajectories_import_file(path=_unlabelled_rows(tmp_path / "rows"))
    call_command("outcomes", str(SWE_BENCH_SUMMARY), stdout=StringIO())
    count = CurationEvent.objects.count()
    out = StringIO()
    call_command("outcomes", str(SWE_BENCH_SUMMARY), "--json", stdout=out)
    [result] = json.loads(out.getvalue())["reports"]
    assert (result["labelled"], CurationEvent.objects.count()) == (0, count)
    assert result["unchanged"] == 2
