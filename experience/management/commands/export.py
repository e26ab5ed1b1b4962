"""`manage.py export [--format trove|atif] [--output FILE] [--filter NAME=VALUE ...]`: export a selection.

Filters are the search filters (experience.search.TrajectoryFilters): task, task_set, model, harness, source,
source_format, status, outcome, curation, duplicate, created_after, created_before, tags, q, ids; lists are
comma-separated. Duplicates are left out unless --filter duplicate=any (or only). Runs are written one
line each as they are read, so an export of any size streams to the file (or stdout).
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from experience.services.exporting import EXPORT_FORMATS, export_filters, trajectories_export_to


class Command(BaseCommand):
    help = "Export trajectories matching the filters as Trove JSONL (lossless, re-importable) or ATIF JSONL."

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=EXPORT_FORMATS, default="trove")
        parser.add_argument("--output", "-o", default="-", help="a file to write (default: stdout)")
        parser.add_argument("--filter", action="append", default=[], metavar="NAME=VALUE",
                            help="a search filter, e.g. --filter model=gpt-4o --filter status=completed,failed")

    def handle(self, *args, **options):
        try:
            filters = export_filters(_pairs(options["filter"]))
            if options["output"] == "-":
                count = trajectories_export_to(filters=filters, format=options["format"], fileobj=sys.stdout.buffer)
            else:
                with open(options["output"], "wb") as handle:
                    count = trajectories_export_to(filters=filters, format=options["format"], fileobj=handle)
        except TroveError as error:
            raise CommandError(error.message) from None
        self.stderr.write(f"exported {count} runs ({options['format']})")


def _pairs(items: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--filter {item!r}: expected NAME=VALUE")
        pairs[name.strip()] = value
    return pairs
