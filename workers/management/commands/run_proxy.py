"""`manage.py run_proxy`: the recording proxy as its own process (full stack)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from webapp.proxy.server import run_proxy
from webapp.proxy.wiring import make_trove_proxy_app


class Command(BaseCommand):
    help = "Serve the recording proxy (/r/<rollout token>/v1/...)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.TROVE_PROXY_HOST)
        parser.add_argument("--port", type=int, default=settings.TROVE_PROXY_PORT)
        parser.add_argument("--unix-path", default=None, help="also listen on this Unix socket")

    def handle(self, *args, host: str, port: int, unix_path: str | None, **options):
        app, sink = make_trove_proxy_app()
        self.stdout.write(f"Recording proxy on http://{host}:{port}/r/<token>/v1/")
        try:
            run_proxy(app=app, host=host, port=port, unix_path=unix_path)
        finally:
            sink.close()
