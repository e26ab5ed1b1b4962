"""`manage.py serve`: the dashboard (and, in the embedded default, the worker, beat and proxy threads)."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.core.servers.basehttp import WSGIServer, run
from django.core.wsgi import get_wsgi_application

from workers.stack import start_embedded_stack


class Command(BaseCommand):
    help = "Serve the dashboard; in the embedded default also run the worker, beat and proxy in this process."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000")
        parser.add_argument("--no-stack", action="store_true", help="serve pages only (full stack deployments)")
        parser.add_argument("--embedded-started", action="store_true", help="internal: the caller already started the embedded stack")

    def handle(self, *args, addr: str, no_stack: bool = False, embedded_started: bool = False, **options):
        stack = None if (no_stack or embedded_started) else start_embedded_stack()
        host, _, port = addr.rpartition(":")
        self.stdout.write(f"Serving Trove on http://{host}:{port}/ (Ctrl-C to stop)")
        try:
            run(host, int(port), get_wsgi_application(), threading=True, server_cls=WSGIServer)
        except KeyboardInterrupt:
            pass
        finally:
            if stack:
                stack.stop()
