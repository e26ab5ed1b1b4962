"""`manage.py import_tasks NAME PATH`: a task set from a JSONL file (see webapp/rollouts/taskset_import.py)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from webapp.rollouts.taskset_import import TaskSetImportError, taskset_import_jsonl


class Command(BaseCommand):
    help = "Import a task set from a JSONL file of SWE-bench-style tasks. Nothing is written if any line is bad."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the new task set's name")
        parser.add_argument("path", help="a .jsonl file, one task per line")
        parser.add_argument("--description", default="")

    def handle(self, *args, **options):
        try:
            with open(options["path"], "rb") as handle:
                task_set = taskset_import_jsonl(name=options["name"], fileobj=handle,
                                                description=options["description"])
        except OSError as error:
            raise CommandError(f"cannot read {options['path']}: {error.strerror}") from None
        except TaskSetImportError as error:
            for line_error in error.errors:
                self.stderr.write(str(line_error))
            raise CommandError(f"{len(error.errors)} problem(s) in {options['path']}; nothing was imported") from None
        except TroveError as error:
            raise CommandError(error.message) from None
        self.stdout.write(self.style.SUCCESS(f"Imported {task_set.tasks.count()} tasks as task set {task_set.name!r}"))
