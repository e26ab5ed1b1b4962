"""`manage.py digest_runs [--batch N]`: derive and keep the distillation digest of every run that has none.

A backfill of what the beat's `trove.datasets.digest_pending` does after ingest (a store imported before
digests existed, or a new DIGEST_VERSION): each finished run with an outcome and no digest of this version
is read once, its digest derived and kept (`TrajectoryDigest`) and its rubric labels written, so that value
builds read digests instead of steps. A run whose digest cannot be derived is recorded as failed and the
backfill goes on past it, even through a batch of nothing but such runs. Postgres only. Prints a summary
as one JSON object on its last line.
"""

from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from experience.distill.digest import DIGEST_VERSION
from experience.services.datasets import PENDING_DIGESTS, digest_pending_runs, digests_derive_next


class Command(BaseCommand):
    help = "Derive and keep the distillation digest of every finished run that has none."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=PENDING_DIGESTS * 5, help="runs per batch")

    def handle(self, *args, batch: int, **options):
        if batch < 1:
            raise CommandError("--batch must be at least 1")
        if connection.vendor != "postgresql":
            raise CommandError("run digests are kept on Postgres only (this database is not)")
        pending = digest_pending_runs().count()
        started, derived = time.monotonic(), 0
        tried: set[int] = set()
        while True:
            taken, done = digests_derive_next(limit=batch)
            # Each run is tried once: one left pending (its steps changed while it was read) ends the loop.
            if not set(taken) - tried:
                break
            tried.update(taken)
            derived += done
            self.stderr.write(f"derived {derived} of {pending}")
        seconds = round(time.monotonic() - started, 1)
        self.stdout.write(
            json.dumps(
                {"version": DIGEST_VERSION, "pending": pending, "derived": derived, "seconds": seconds}
            )
        )
