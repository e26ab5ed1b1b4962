"""`manage.py run_proxy`: the recording proxy as its own process (full stack).

With REDIS_URL set, records go to this Trove's Redis stream (the `trove.proxy.ingest` task stores them);
while Redis is down they are spooled under TROVE_PROXY_SPOOL_DIR and re-sent once it is back, including
what an earlier proxy process left there. Without REDIS_URL they are written to the database directly.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp.proxy.locations import proxy_spool_dir, proxy_stream
from webapp.proxy.recorder import RedisStreamSink
from webapp.proxy.server import run_proxy
from webapp.proxy.wiring import make_trove_proxy_app


class Command(BaseCommand):
    help = "Serve the recording proxy (/r/<rollout token>/v1/...)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.TROVE_PROXY_HOST)
        parser.add_argument("--port", type=int, default=settings.TROVE_PROXY_PORT)
        parser.add_argument("--unix-path", default=None, help="also listen on this Unix socket")
        parser.add_argument("--upstream-timeout", type=float, default=600.0,
                            help="seconds of upstream silence before a call fails with 504")

    def handle(self, *args, host: str, port: int, unix_path: str | None, upstream_timeout: float, **options):
        app, sink = make_trove_proxy_app(upstream_timeout=upstream_timeout)
        where = (f"Redis stream {proxy_stream()}" if isinstance(sink, RedisStreamSink) else "the database directly")
        self.stdout.write(f"Recording proxy on http://{host}:{port}/r/<token>/v1/; records to {where}, "
                          f"spooled in {proxy_spool_dir()} when that fails")
        try:
            run_proxy(app=app, host=host, port=port, unix_path=unix_path)
        finally:
            sink.close(30)
