"""`manage.py import PATH [PATH ...] [--format F]`: import trajectory files, or every file under a directory.

Detects each file's format (or takes --format), shows a progress bar, keeps each original file as a blob,
and reports per file what it imported and what it skipped and why: runs already in the store, files that
are not trajectories, and invalid files (with the error; nothing of such a file is written). Then indexes
the new runs for full-text search (--no-index leaves that to the periodic indexer). Runs already stored under
another path (by content) are reported as duplicates of the stored run; runs whose file changed since they
were imported are reported as changed with what differs (--replace imports the new version and keeps the
old run as history). Exits non-zero when a file was invalid, when a file named on the command line is not a
trajectory file, or when nothing under a directory named on the command line is a run of the store (no run
imported, already present, duplicate or changed: a directory of files Trove cannot read). SWE-bench
evaluation reports among the files (a summary with resolved_ids / unresolved_ids, logs/<id>/report.json)
label the runs of this import they name; each report's line says how many it labelled, how many runs it does
not mention, and which of its ids matched no run.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from tqdm import tqdm

from experience.importers import REGISTRY
from experience.services.importing import (
    CHANGED,
    DUPLICATE,
    FILES_PER_COMMIT,
    IMPORTED,
    INVALID,
    PRESENT,
    REPORT,
    UNRECOGNISED,
    FileReport,
    ImportReport,
    reports_apply,
    trajectories_import_file,
    trajectory_files,
)
from experience.services.outcome_labels import describe_labels
from experience.services.search_index import search_index_all


class Command(BaseCommand):
    help = "Import trajectory files (SWE-agent, mini-swe-agent, OpenHands, Inspect, OpenAI messages, ATIF, Trove)."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH", help="a file or a directory (read recursively)")
        parser.add_argument("--format", choices=sorted(REGISTRY), help="skip detection: read every file as this")
        parser.add_argument("--success-threshold", type=float, metavar="R",
                            help="a run with a reward and no success flag succeeded when reward >= R "
                                 "(default: only 0/1 rewards decide; the verdict is marked as derived)")
        parser.add_argument("--replace", action="store_true",
                            help="re-import runs whose file changed since; the old runs are kept as history")
        parser.add_argument("--no-index", action="store_true", help="do not index the new runs for search now")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")

    def handle(self, *args, **options):
        report = ImportReport()
        explicit: set[str] = set()
        folders: dict[str, list[str]] = {}  # a directory named on the command line -> the files under it
        work: list[tuple[Path, str | None]] = []
        for raw in options["paths"]:
            path = Path(raw)
            if not path.exists():
                raise CommandError(f"{raw}: no such file or directory")
            files = trajectory_files(path)
            if path.is_file():
                explicit.add(str(path))
            else:
                folders[raw] = [str(f) for f, _ in files]
            work += files
        self._run(work, options, report)
        reports_apply(report)  # SWE-bench reports among the files label the runs just read
        indexed = 0 if options["no_index"] else search_index_all()
        self._report(report, indexed, options["json"])
        self._exit_status(report, explicit, folders)

    def _run(self, work: list[tuple[Path, str | None]], options: dict, report: ImportReport) -> None:
        bar = tqdm(total=len(work), unit="file", disable=options["no_progress"], dynamic_ncols=True)
        runs = 0

        def counted(n: int) -> None:
            nonlocal runs
            runs += n
            bar.set_postfix(runs=runs, refresh=False)

        with bar:
            for start in range(0, len(work), FILES_PER_COMMIT):
                with transaction.atomic():  # files share a commit, each still all or nothing (a savepoint)
                    for path, name in work[start:start + FILES_PER_COMMIT]:
                        bar.set_description(path.name[:40])
                        report.files.append(trajectories_import_file(
                            path=path, format=options["format"], name=name, on_runs=counted,
                            success_threshold=options["success_threshold"], replace=options["replace"]))
                        bar.update(1)

    def _report(self, report: ImportReport, indexed: int, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps({**report.as_dict(), "indexed_for_search": indexed}))
            return
        for item in report.files:
            self.stdout.write(_line(item))
        self.stdout.write(
            f"{report.imported} runs imported, {report.present} already present, {report.duplicates} duplicates "
            f"of stored runs, {report.changed} changed since imported; files: "
            f"{report.count(IMPORTED)} imported, {report.count(PRESENT)} already imported, "
            f"{report.count(INVALID)} invalid, {report.count(UNRECOGNISED)} not trajectory files"
            + (f"; {indexed} runs indexed for search" if indexed else "")
        )

    def _exit_status(self, report: ImportReport, explicit: set[str], folders: dict[str, list[str]]) -> None:
        bad = [f for f in report.files if f.status == INVALID or (f.status == UNRECOGNISED and f.path in explicit)]
        if bad:
            raise CommandError(f"{len(bad)} file(s) not imported: {bad[0].error}")
        by_path = {f.path: f for f in report.files}
        for folder, files in folders.items():
            if not any(by_path[f].status not in (INVALID, UNRECOGNISED) for f in files if f in by_path):
                raise CommandError(f"{folder}: nothing imported ({len(files)} file(s), none a trajectory file "
                                   f"Trove reads)")


def _line(item: FileReport) -> str:
    if item.status == IMPORTED:
        extra = f", {item.present} already present" if item.present else ""
        kept = "" if item.original_kept else " (original too large to keep)"
        replaced = f", {item.replaced} replaced (old runs kept)" if item.replaced else ""
        return f"imported  {item.path}: {item.imported} runs ({item.format}){extra}{replaced}{kept}" + _notes(item)
    if item.status == PRESENT:
        return f"skipped   {item.path}: already imported ({item.present} runs)" + _notes(item)
    if item.status == REPORT:
        return f"report    {item.path}: " + describe_labels(item.labels)
    if item.status in (CHANGED, DUPLICATE):
        return f"skipped   {item.path}:" + _notes(item).lstrip(";")
    if item.status == UNRECOGNISED:
        return f"skipped   {item.path}: not a trajectory file ({item.error})"
    return f"invalid   {item.path}: {item.error} (nothing imported from this file)"


def _notes(item: FileReport) -> str:
    """The duplicates and changed runs of a file, one clause each (the first few named)."""
    notes = ""
    if item.duplicates:
        named = ", ".join(f"{d['source_ref']} = run {d['duplicate_of']}" for d in item.duplicates[:3])
        notes += f"; {len(item.duplicates)} duplicate(s) of stored runs, not imported again ({named})"
    if item.changed:
        named = ", ".join(f"run {c['trajectory_id']} ({c['differs']})" for c in item.changed[:3])
        notes += f"; {len(item.changed)} run(s) changed since imported, not replaced ({named}; --replace imports them)"
    return notes

