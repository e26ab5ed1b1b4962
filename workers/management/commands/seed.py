"""`manage.py seed`: the demo task set and a local fleet, for a full-stack install's first look.

No login is made here (a lab makes its own with `createsuperuser`); `manage.py demo` is the embedded,
all-in-one path that also seeds an admin login.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from workers.seed import seed_demo_task_set, seed_local_fleet


class Command(BaseCommand):
    help = "Seed the demo task set and a local bubblewrap fleet (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--min-warm", type=int, default=2, help="sandboxes the fleet keeps warm")

    def handle(self, *args, min_warm: int, **options):
        task_set = seed_demo_task_set()
        fleet = seed_local_fleet(min_warm=min_warm)
        self.stdout.write(f"task set {task_set.name!r} ({task_set.tasks.count()} tasks), "
                          f"fleet {fleet.name!r} (min_warm {fleet.min_warm})")
