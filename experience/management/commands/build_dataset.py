"""`manage.py build_dataset NAME`: build a new version of a dataset here and now (no worker needed).

With `--kind` (and optionally `--filters` / `--options` as JSON) a dataset that does not exist yet is
created from that spec first. Prints the version's counts and where its files are.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from experience.distill.spec import SPLITS
from experience.errors import NotFound, TroveError
from experience.models import DatasetVersion
from experience.services import datasets


class Command(BaseCommand):
    help = (
        "Build a new version of a dataset (creating it from --kind/--filters/--options if it does not exist)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--kind", choices=("value", "outcome", "pairwise", "sft"))
        parser.add_argument(
            "--filters", default="{}", help='JSON, e.g. {"task_sets": ["demo-python-bugfix"]}'
        )
        parser.add_argument("--options", default="{}", help='JSON spec options, e.g. {"gamma": 0.9}')
        parser.add_argument("--force", action="store_true", help="build even when a split would be empty")

    def handle(self, *args, **options):
        try:
            dataset = self._dataset(options)
            version = datasets.dataset_version_request(dataset=dataset, force=options["force"])
            version = datasets.dataset_version_build(version_id=version.pk)
        except TroveError as error:
            raise CommandError(error.message) from None
        if version is None or version.status != DatasetVersion.Status.READY:
            raise CommandError(f"build failed: {version.error if version else 'another builder holds it'}")
        self._report(version)

    def _dataset(self, options):
        try:
            return datasets.dataset_get(ref=options["name"])
        except NotFound:
            if not options["kind"]:
                raise CommandError(f"no dataset {options['name']!r}: give --kind to create it") from None
        return datasets.dataset_create(
            name=options["name"], kind=options["kind"],
            filters=_json(options["filters"], "--filters"), options=_json(options["options"], "--options"),
        )  # fmt: skip

    def _report(self, version: DatasetVersion) -> None:
        manifest = version.manifest
        self.stdout.write(f"{version}: {version.row_count} rows, content hash {version.content_hash[:16]}")
        for split in SPLITS:
            counts = manifest["splits"][split]
            rate = counts["positive_rate"]
            shown = "—" if rate is None else f"{rate:.2f}"
            self.stdout.write(
                f"  {split:5}  rows {counts['rows']:>8}  tasks {counts['tasks']:>5}  positive {shown}"
            )
        self.stdout.write(f"  files in {datasets.version_dir(version)}")


def _json(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(f"{flag}: not JSON ({error.msg})") from None
    if not isinstance(value, dict):
        raise CommandError(f"{flag}: must be a JSON object")
    return value
