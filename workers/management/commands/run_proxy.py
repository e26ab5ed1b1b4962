"""`manage.py run_proxy`: the recording proxy as its own process(es) (full stack).

With REDIS_URL set, records go to this Trove's Redis stream (the `trove.proxy.ingest` task stores them);
while Redis is down they are spooled under TROVE_PROXY_SPOOL_DIR and re-sent once it is back, including
what an earlier proxy process left there. Without REDIS_URL they are written to the database directly.

It serves with one process per CPU by default (at most 8; `--workers` or TROVE_PROXY_WORKERS to choose):
the proxy is CPU-bound Python, so one process uses one core at most. The workers share the port
(SO_REUSEPORT); each has its own record sink and spool segment.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections

from webapp.proxy.locations import proxy_spool_dir, proxy_stream
from webapp.proxy.server import default_workers, serve_proxy
from webapp.proxy.wiring import make_trove_proxy_app


class Command(BaseCommand):
    help = "Serve the recording proxy (/r/<rollout token>/v1/...)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.TROVE_PROXY_HOST)
        parser.add_argument("--port", type=int, default=settings.TROVE_PROXY_PORT)
        parser.add_argument("--unix-path", default=None, help="also listen on this Unix socket")
        parser.add_argument("--upstream-timeout", type=float, default=600.0,
                            help="seconds of upstream silence before a call fails with 504")
        parser.add_argument("--workers", type=int, default=None,
                            help="processes (default: TROVE_PROXY_WORKERS, else one per CPU, at most 8)")

    def handle(self, *args, host: str, port: int, unix_path: str | None, upstream_timeout: float,
               workers: int | None, **options):
        workers = workers or settings.TROVE_PROXY_WORKERS or default_workers()
        where = f"Redis stream {proxy_stream()}" if settings.REDIS_URL else "the database directly"
        self.stdout.write(f"Recording proxy on http://{host}:{port}/r/<token>/v1/ ({workers} process(es)); "
                          f"records to {where}, spooled in {proxy_spool_dir()} when that fails")
        connections.close_all()  # each worker opens its own; none may be shared across the fork
        serve_proxy(lambda: make_trove_proxy_app(upstream_timeout=upstream_timeout), workers=workers,
                    host=host, port=port, unix_path=unix_path)
