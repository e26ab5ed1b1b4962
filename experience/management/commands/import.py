"""`manage.py import PATH [PATH ...] [--format F]`: import trajectory files, or every file under a directory.

Detects each file's format (or takes --format), shows a progress bar, keeps each original file as a blob,
and reports per file what it imported and what it skipped and why: runs already in the store, files that
are not trajectories, and invalid files (with the error; nothing of such a file is written). Then indexes
the new runs for full-text search (--no-index leaves that to the periodic indexer). Exits non-zero when a
file was invalid, or when a file named on the command line is not a trajectory file.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from experience.importers import REGISTRY
from experience.services.importing import (
    IMPORTED,
    INVALID,
    PRESENT,
    UNRECOGNISED,
    FileReport,
    ImportReport,
    trajectories_import_file,
    trajectory_files,
)
from experience.services.search_index import search_index_all


class Command(BaseCommand):
    help = "Import trajectory files (SWE-agent, mini-swe-agent, OpenHands, Inspect, OpenAI messages, ATIF, Trove)."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", metavar="PATH", help="a file or a directory (read recursively)")
        parser.add_argument("--format", choices=sorted(REGISTRY), help="skip detection: read every file as this")
        parser.add_argument("--success-threshold", type=float, metavar="R",
                            help="a run with a reward and no success flag succeeded when reward >= R "
                                 "(default: only 0/1 rewards decide; the verdict is marked as derived)")
        parser.add_argument("--no-index", action="store_true", help="do not index the new runs for search now")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")

    def handle(self, *args, **options):
        report = ImportReport()
        explicit: set[str] = set()
        work: list[tuple[Path, str | None]] = []
        for raw in options["paths"]:
            path = Path(raw)
            if not path.exists():
                raise CommandError(f"{raw}: no such file or directory")
            if path.is_file():
                explicit.add(str(path))
            work += trajectory_files(path)
        self._run(work, options, report)
        indexed = 0 if options["no_index"] else search_index_all()
        self._report(report, indexed, options["json"])
        self._exit_status(report, explicit)

    def _run(self, work: list[tuple[Path, str | None]], options: dict, report: ImportReport) -> None:
        bar = tqdm(total=len(work), unit="file", disable=options["no_progress"], dynamic_ncols=True)
        runs = 0

        def counted(n: int) -> None:
            nonlocal runs
            runs += n
            bar.set_postfix(runs=runs, refresh=False)

        with bar:
            for path, name in work:
                bar.set_description(path.name[:40])
                report.files.append(trajectories_import_file(
                    path=path, format=options["format"], name=name, on_runs=counted,
                    success_threshold=options["success_threshold"]))
                bar.update(1)

    def _report(self, report: ImportReport, indexed: int, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps({**report.as_dict(), "indexed_for_search": indexed}))
            return
        for item in report.files:
            self.stdout.write(_line(item))
        self.stdout.write(
            f"{report.imported} runs imported, {report.present} already present; files: "
            f"{report.count(IMPORTED)} imported, {report.count(PRESENT)} already imported, "
            f"{report.count(INVALID)} invalid, {report.count(UNRECOGNISED)} not trajectory files"
            + (f"; {indexed} runs indexed for search" if indexed else "")
        )

    def _exit_status(self, report: ImportReport, explicit: set[str]) -> None:
        bad = [f for f in report.files if f.status == INVALID or (f.status == UNRECOGNISED and f.path in explicit)]
        if bad:
            raise CommandError(f"{len(bad)} file(s) not imported: {bad[0].error}")


def _line(item: FileReport) -> str:
    if item.status == IMPORTED:
        extra = f", {item.present} already present" if item.present else ""
        kept = "" if item.original_kept else " (original too large to keep)"
        return f"imported  {item.path}: {item.imported} runs ({item.format}){extra}{kept}"
    if item.status == PRESENT:
        return f"skipped   {item.path}: already imported ({item.present} runs)"
    if item.status == UNRECOGNISED:
        return f"skipped   {item.path}: not a trajectory file ({item.error})"
    return f"invalid   {item.path}: {item.error} (nothing imported from this file)"
