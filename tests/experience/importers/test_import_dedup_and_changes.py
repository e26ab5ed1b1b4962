"""Importing into the store: the same run under another path or re-serialised is a duplicate of the stored run,
a file that changed since it was imported is reported as changed (replace re-imports it, keeping history),
`manage.py import DIR` that imported nothing fails, and files of formats Trove does not read are named."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from experience.importers import ImportFormatError, detect_format
from experience.models import CurationEvent, Step, Trajectory
from experience.services.importing import trajectories_import_file, trajectories_import_path
from importers.fixture_files import CLAUDE_SESSION, CONVERSATIONS, QWEN_SESSION, TAU_BENCH, raw_jsonl

pytestmark = pytest.mark.django_db


def _as_array(tmp_path: Path) -> Path:
    array = tmp_path / "moved" / "runs.json"
    array.parent.mkdir()
    array.write_text(json.dumps(raw_jsonl(CONVERSATIONS), indent=2))
    return array


def test_the_same_runs_re_serialised_elsewhere_are_duplicates_of_the_stored_runs(tmp_path: Path) -> None:
    first = trajectories_import_file(path=CONVERSATIONS)
    before = (Trajectory.objects.count(), Step.objects.count())

    again = trajectories_import_file(path=_as_array(tmp_path))

    assert (again.status, again.imported, again.format) == ("duplicate", 0, "openai_conversations")
    assert [d["duplicate_of"] for d in again.duplicates] == first.trajectory_ids
    assert [d["stored_ref"] for d in again.duplicates] == list(
        Trajectory.objects.filter(pk__in=first.trajectory_ids).order_by("id").values_list("source_ref", flat=True))
    assert (Trajectory.objects.count(), Step.objects.count()) == before


def test_a_session_copied_under_another_folder_is_already_present(tmp_path: Path) -> None:
    trajectories_import_file(path=CLAUDE_SESSION)
    copy = tmp_path / "backup" / CLAUDE_SESSION.name
    shutil.copytree(CLAUDE_SESSION.parent, copy.parent)
    copy.write_bytes(copy.read_bytes() + b"\n")  # other bytes: the session ids must recognise it, not the hash

    again = trajectories_import_file(path=copy)

    assert (again.status, again.imported, again.present) == ("present", 0, 2)
    assert Trajectory.objects.filter(harness="claude-code").count() == 2


def _changed_copy(tmp_path: Path) -> Path:
    rows = raw_jsonl(CONVERSATIONS)
    rows[0]["reward"], rows[0]["success"] = 0.0, False
    rows[0]["messages"].append({"role": "user", "content": "one more thing"})
    changed = tmp_path / "samples" / CONVERSATIONS.name  # the same name: the same refs
    changed.parent.mkdir()
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return changed


def test_a_changed_file_is_reported_as_changed_with_what_differs_and_not_written(tmp_path: Path) -> None:
    first = trajectories_import_file(path=CONVERSATIONS)
    stored = Trajectory.objects.get(pk=first.trajectory_ids[0])

    again = trajectories_import_file(path=_changed_copy(tmp_path))

    assert (again.status, again.imported, again.present) == ("changed", 0, 2)
    assert again.changed == [{"source_ref": stored.source_ref, "trajectory_id": stored.pk,
                              "differs": f"steps {stored.n_steps} -> {stored.n_steps + 1}, reward 1.0 -> 0.0, "
                                         "success True -> False"}]
    stored.refresh_from_db()
    assert (stored.reward, stored.success, Trajectory.objects.count()) == (1.0, True, 3)


def test_replace_re_imports_a_changed_run_and_keeps_the_old_one_as_history(tmp_path: Path) -> None:
    first = trajectories_import_file(path=CONVERSATIONS)
    old = Trajectory.objects.get(pk=first.trajectory_ids[0])
    ref, old_steps = old.source_ref, old.n_steps

    again = trajectories_import_file(path=_changed_copy(tmp_path), replace=True)

    assert (again.status, again.imported, again.replaced, again.present) == ("imported", 1, 1, 2)
    new = Trajectory.objects.get(source="import", source_ref=ref)
    old.refresh_from_db()
    assert (new.reward, new.success, new.n_steps) == (0.0, False, old_steps + 1)
    assert (old.source_ref, old.tags, old.reward, old.n_steps) == (f"{ref}~replaced-{old.pk}", ["replaced"], 1.0,
                                                                    old_steps)
    assert (old.metadata["replaced_by"], new.metadata["replaces"]) == (new.pk, old.pk)
    assert Step.objects.filter(trajectory=old).count() == old_steps
    events = {e.trajectory_id: (e.action, e.after) for e in CurationEvent.objects.all()}
    assert events == {old.pk: ("import_replaced", {"source_ref": old.source_ref}),
                      new.pk: ("import_replaces", {"replaces": old.pk})}


def test_a_copy_of_a_replaced_run_is_a_duplicate_of_its_current_version_not_the_history(tmp_path: Path) -> None:
    first = trajectories_import_file(path=CONVERSATIONS)
    rows = raw_jsonl(CONVERSATIONS)
    rows[0]["reward"], rows[0]["success"] = 0.0, False  # relabelled, same steps: both versions share a fingerprint
    relabelled = tmp_path / "samples" / CONVERSATIONS.name
    relabelled.parent.mkdir()
    relabelled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trajectories_import_file(path=relabelled, replace=True)
    current = Trajectory.objects.get(pk=Trajectory.objects.get(pk=first.trajectory_ids[0]).metadata["replaced_by"])
    copy = tmp_path / "moved" / "runs.json"
    copy.parent.mkdir()
    copy.write_text(json.dumps(rows, indent=2))

    again = trajectories_import_file(path=copy)

    assert again.status == "duplicate"
    assert [d["duplicate_of"] for d in again.duplicates] == [current.pk, *first.trajectory_ids[1:]]
    assert again.duplicates[0]["stored_ref"] == current.source_ref


def test_a_directory_of_runs_imports_and_a_directory_of_nothing_fails(tmp_path: Path) -> None:
    runs, junk = tmp_path / "runs", tmp_path / "junk"
    runs.mkdir(), junk.mkdir()
    shutil.copy(TAU_BENCH, runs / TAU_BENCH.name)
    (junk / "notes.md").write_text("# notes\n")
    (junk / "config.json").write_text(json.dumps({"lr": 0.1}))
    out = StringIO()

    call_command("import", str(runs), "--no-progress", "--no-index", stdout=out)
    with pytest.raises(CommandError, match=r"junk: nothing imported \(2 file\(s\), none a trajectory file"):
        call_command("import", str(junk), "--no-progress", "--no-index", stdout=StringIO())

    assert "1 runs imported" in out.getvalue()
    call_command("import", str(runs), "--no-progress", "--no-index", stdout=StringIO())  # present again: fine


def test_a_project_folder_names_its_aider_history_though_other_dotfiles_stay_unread(tmp_path: Path) -> None:
    # aider writes its history as a dotfile at the project's root: skipped with the other hidden files, a
    # folder holding one would say "none a trajectory file" without naming the format.
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "config").write_text("[core]\n")
    (project / ".aider.chat.history.md").write_text("\n# aider chat started at 2025-01-02 10:00:00\n\n#### fix it\n")

    report = trajectories_import_path(path=project)

    assert [(Path(f.path).name, f.status) for f in report.files] == [(".aider.chat.history.md", "unrecognised")]
    assert "this looks like an aider chat history" in report.files[0].error
    with pytest.raises(CommandError, match=r"nothing imported \(1 file\(s\)"):
        call_command("import", str(project), "--no-progress", "--no-index", stdout=StringIO())


def test_the_command_passes_the_success_threshold_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "scores.json"
    rows = [{"task_id": "t", "trial": 0, "score": 0.8, "messages": [{"role": "user", "content": "hi"}]}]
    path.write_text(json.dumps(rows, indent=2))
    call_command("import", str(path), "--success-threshold", "0.75", "--no-progress", "--no-index", stdout=StringIO())
    run = Trajectory.objects.get()
    assert (run.success, run.metadata["outcome_derived"]) == (True, {"success": "reward >= 0.75 (--success-threshold)"})

    rows[0]["score"] = 0.7
    path.write_text(json.dumps(rows, indent=2))
    out = StringIO()
    call_command("import", str(path), "--no-progress", "--no-index", stdout=out)
    assert "1 run(s) changed since imported, not replaced" in out.getvalue() and "reward 0.8 -> 0.7" in out.getvalue()
    call_command("import", str(path), "--replace", "--no-progress", "--no-index", stdout=StringIO())
    assert sorted(Trajectory.objects.values_list("reward", flat=True)) == [0.7, 0.8]


def test_a_directory_report_names_duplicates(tmp_path: Path) -> None:
    trajectories_import_file(path=CONVERSATIONS)
    report = trajectories_import_path(path=_as_array(tmp_path).parent)
    assert report.as_dict()["duplicates"] == 3 and report.as_dict()["imported"] == 0


@pytest.mark.parametrize(("name", "content", "named"), [
    (".aider.chat.history.md", "\n# aider chat started at 2025-01-02 10:00:00\n\n#### fix the bug\n", "aider chat"),
    ("logs.json", json.dumps([{"sessionId": "s1", "messageId": 0, "type": "user", "message": "hi",
                               "timestamp": "2025-07-01T10:00:00.000Z"}], indent=2), "Gemini CLI log"),
    ("session-2025-07-01.json", json.dumps({"sessionId": "s1", "projectHash": "ab12", "messages": [
        {"id": "m1", "type": "user", "content": "hi"}, {"id": "m2", "type": "gemini", "content": "hello"}]}),
     "Gemini CLI saved chat"),
    # Gemini CLI 0.x's chats as JSONL: a header line, then "$set" updates (as the catalogue's gemini-cli writes)
    ("session-2026-12-02T06-29-d0.jsonl", json.dumps({"sessionId": "s1", "projectHash": "ab12", "kind": "main"})
     + "\n" + json.dumps({"$set": {"messages": [{"id": "m1", "type": "user", "content": [{"text": "hi"}]},
                                                 {"id": "m2", "type": "gemini", "content": "hello"}]}}) + "\n",
     "Gemini CLI saved chat"),
    # Qwen Code keeps Claude Code's line envelope (uuid, parentUuid, sessionId, type) around Gemini messages:
    # read as Claude Code it gave a run of empty steps
    (QWEN_SESSION.name, QWEN_SESSION.read_text(), "Qwen Code session"),
    (QWEN_SESSION.name, "".join(QWEN_SESSION.read_text().splitlines(keepends=True)[1:]), "Qwen Code session"),
])
def test_a_known_unsupported_format_is_named(tmp_path: Path, name: str, content: str, named: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ImportFormatError, match=f"this looks like an? {named}.*which Trove does not import yet"):
        detect_format(path)


def test_a_claude_projects_folder_imports_sessions_and_subagents_once(tmp_path: Path) -> None:
    projects = tmp_path / "projects"
    shutil.copytree(CLAUDE_SESSION.parents[1], projects)

    report = trajectories_import_path(path=projects)

    counts = {Path(f.path).name: (f.imported, f.present) for f in report.files}
    # the walk reaches the subagent's folder before its session file: the session then finds it stored
    assert counts["agent-a9e41c07.jsonl"] == (1, 0) and counts[CLAUDE_SESSION.name] == (1, 1)
    assert Trajectory.objects.filter(source_ref__contains="7f3c2a10-5b1e-4c2d-9a8f-0e6d4b3c2a11").count() == 2
    subagent = Trajectory.objects.get(source_ref__endswith="/agent-a9e41c07")
    parent = Trajectory.objects.get(source_ref=subagent.metadata["parent_source_ref"])
    assert parent.metadata["subagent_source_refs"] == [subagent.source_ref]
