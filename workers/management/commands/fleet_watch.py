"""`manage.py fleet_watch`: stream the Kubernetes backend's pod changes into the fleet rows (full stack).

Run one beside `celery beat`. Without it everything still converges, one reconcile round later: a pending
pod becomes warm when the next round lists it ready. With it, within moments. Two at once are harmless
(every write is conditional). Stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand

from workers.reconciler import fleet_watch


class Command(BaseCommand):
    help = "Watch the sandbox backend and write what it reports (ready, failed, deleted) to the fleet rows."

    def add_arguments(self, parser):
        parser.add_argument("--backend", default="kubernetes", choices=("kubernetes",))

    def handle(self, *args, backend: str, **options):
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"Watching the {backend} backend's sandboxes; Ctrl-C to stop.")
        fleet_watch(stop_event=stop, backend_kind=backend)
