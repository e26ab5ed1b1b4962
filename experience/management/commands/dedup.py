"""`manage.py dedup [--rebuild] [--embedder lexical|minilm] [--across-tasks]`: deduplicate the store.

Without --rebuild: a backfill. Every finished run not yet embedded by the embedder is hashed, embedded and
placed (exact duplicate, near duplicate or unique), in batches, as the periodic task does.
With --rebuild: re-embed every finished run whose signature or embedder changed, rebuild the FAISS index
from the stored vectors, and re-cluster all automatic clusters in one batch (curated clusters are kept).
Prints a summary as one JSON object on its last line.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand
from tqdm import tqdm

from experience.dedup.embed import embedder_names
from experience.services.dedup import (
    DedupReport,
    dedup_embedder,
    dedup_pending,
    dedup_rebuild,
    embedder_key,
    index_refresh,
    pending_trajectories,
)


class Command(BaseCommand):
    help = "Deduplicate trajectories: backfill the runs not yet embedded, or --rebuild index and clusters."

    def add_arguments(self, parser):
        parser.add_argument("--rebuild", action="store_true", help="re-embed, rebuild the index, re-cluster")
        parser.add_argument("--embedder", choices=embedder_names(), help="default: TROVE_DEDUP_EMBEDDER (lexical)")
        parser.add_argument("--across-tasks", action="store_true", help="near duplicates may be of other tasks")
        parser.add_argument("--batch", type=int, default=500, help="runs per batch")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args, **options):
        embedder = dedup_embedder(options["embedder"])
        if options["rebuild"]:
            summary = self._rebuild(embedder, options)
        else:
            summary = self._backfill(embedder, options)
        self.stdout.write(json.dumps(summary, sort_keys=True))

    def _rebuild(self, embedder, options) -> dict:
        from experience.models import Trajectory

        total = Trajectory.objects.exclude(status=Trajectory.Status.RUNNING).count()
        with tqdm(total=total, unit="run", disable=options["no_progress"], file=self.stderr) as bar:
            return dedup_rebuild(embedder=embedder, across_tasks=options["across_tasks"], batch=options["batch"],
                                 progress=bar.update)

    def _backfill(self, embedder, options) -> dict:
        total = DedupReport()
        pending = pending_trajectories(embedder=embedder).count()
        with tqdm(total=pending, unit="run", disable=options["no_progress"], file=self.stderr) as bar:
            while True:
                report = dedup_pending(limit=options["batch"], embedder=embedder, across_tasks=options["across_tasks"])
                if not report.trajectory_ids:
                    break
                for name, value in report.as_dict().items():
                    setattr(total, name, getattr(total, name) + value)
                bar.update(len(report.trajectory_ids))
        index = index_refresh(embedder=embedder)
        return {"embedder": embedder_key(embedder), "indexed": len(index), "index_kind": index.kind,
                **total.as_dict()}
