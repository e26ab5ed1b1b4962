"""`manage.py outcomes REPORT [REPORT ...] [--filter NAME=VALUE ...]`: label runs already in the store from
evaluation reports.

REPORT is a SWE-bench summary (resolved_ids / unresolved_ids, as the harness and sb-cli write it), a
per-instance logs/.../<instance_id>/report.json, a directory holding such files (read recursively), or a JSONL
of {trajectory_id | source_ref | task_key [, sample], reward, success} (see experience.importers.reports).
--filter narrows the runs that may be labelled, with the explorer's filter names (model=..., harness=...,
source_format=..., task_set=..., tags=...). Every change is a CurationEvent naming the report
(experience.services.outcome_labels), so labels can be audited and undone. --dry-run says what would change and
writes nothing. Exits non-zero when a REPORT is not a report, or when no report matched any run. The API's
POST /api/v1/outcomes/ does the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from experience.importers import reports
from experience.search import filters_from_params, trajectory_search
from experience.services.outcome_labels import describe_labels, trajectories_label_from_report


class Command(BaseCommand):
    help = "Label stored runs from SWE-bench evaluation reports or a JSONL of outcomes."

    def add_arguments(self, parser):
        parser.add_argument("reports", nargs="+", metavar="REPORT", help="a report file, or a directory of them")
        parser.add_argument("--filter", action="append", default=[], metavar="NAME=VALUE",
                            help="only label runs matching this filter (repeatable), e.g. model=gpt-4o")
        parser.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")

    def handle(self, *args, **options):
        try:
            scope = trajectory_search(filters=filters_from_params(_filter_params(options["filter"])))
        except TroveError as error:
            raise CommandError(f"--filter {error.message}") from None
        results = [self._apply(path, scope, options["dry_run"]) for path in _report_files(options["reports"])]
        if options["json"]:
            self.stdout.write(json.dumps({"reports": results}))
        else:
            for result in results:
                would = " (dry run: nothing changed)" if result["dry_run"] else ""
                self.stdout.write(f"report    {result['source']}: {describe_labels(result)}{would}")
        if not any(r["trajectory_ids"] for r in results):
            raise CommandError("no report matched any run in the store" + (" (with the filters given)"
                                                                          if options["filter"] else ""))

    def _apply(self, path: Path, scope, dry_run: bool) -> dict:
        try:
            labels = reports.read_labels(path)
        except TroveError as error:
            raise CommandError(error.message) from None
        return trajectories_label_from_report(labels=labels, scope=scope, source=str(path), dry_run=dry_run).as_dict()


def _filter_params(given: list[str]) -> dict[str, str]:
    params = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--filter {item!r}: expected NAME=VALUE")
        params[name.strip()] = value.strip()
    return params


def _report_files(given: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in given:
        path = Path(raw)
        if not path.exists():
            raise CommandError(f"{raw}: no such file or directory")
        if path.is_file():
            files.append(path)
            continue
        found = sorted(p for p in path.rglob("*") if p.is_file() and reports.detect(p))
        if not found:
            raise CommandError(f"{raw}: no evaluation report found in this directory")
        files += found
    return files
