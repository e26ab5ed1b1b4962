"""The embedded default's Celery worker: a worker thread in this process on the memory transport.

The memory transport's queues live in this process, so only tasks sent from here reach it, which is
exactly the embedded model (one process: web, worker, proxy). On the full stack this is never started.
"""

from __future__ import annotations

import threading

from celery.worker import WorkController

from webapp.celery import app

_worker: WorkController | None = None
_lock = threading.Lock()


def start_embedded_worker(*, concurrency: int = 2) -> WorkController:
    global _worker
    with _lock:
        if _worker is not None:
            return _worker
        app.loader.import_default_modules()
        worker = WorkController(
            app=app, concurrency=concurrency, pool="threads", hostname="embedded@trove",
            without_heartbeat=True, without_mingle=True, without_gossip=True, loglevel="WARNING",
        )
        threading.Thread(target=worker.start, name="celery-embedded", daemon=True).start()
        _worker = worker
        return worker


def stop_embedded_worker() -> None:
    global _worker
    with _lock:
        if _worker is not None:
            _worker.stop(in_sighandler=False)
            _worker = None
