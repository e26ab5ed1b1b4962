"""`manage.py value_baseline VERSION`: train the baseline value model on a value or outcome version.

VERSION is `NAME@N` (or `NAME:N`) or a version id. Prints AUC on val and the best-of-N table on the
test tasks, stores them on the version's metrics, and writes per-step value estimates back to the steps
of the test-split runs (`--scope all`: every run of the version).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from experience.services.datasets import dataset_version_resolve
from experience.services.value_baseline import BEST_OF, SCOPES, value_baseline_run


class Command(BaseCommand):
    help = "Train the baseline value model on a dataset version; report AUC and best-of-N; score the steps."

    def add_arguments(self, parser):
        parser.add_argument("version", help="NAME@N or a version id")
        parser.add_argument("--best-of", type=int, nargs="+", default=list(BEST_OF))
        parser.add_argument("--trials", type=int, default=200, help="random draws of N runs per test task")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--scope", choices=SCOPES, default="test", help="whose steps get value estimates")
        parser.add_argument(
            "--aggregate",
            choices=("last", "mean"),
            default="last",
            help="a run's score: the value at its last decision, or the mean over decisions",
        )

    def handle(self, *args, **options):
        try:
            version = dataset_version_resolve(ref=options["version"])
            metrics = value_baseline_run(
                version=version, best_of=options["best_of"], trials=options["trials"], seed=options["seed"],
                scope=options["scope"], aggregate=options["aggregate"],
            )  # fmt: skip
        except TroveError as error:
            raise CommandError(error.message) from None
        self._report(version, metrics)

    def _report(self, version, metrics: dict) -> None:
        auc = metrics["auc_val"]
        self.stdout.write(f"{version}: trained on {metrics['train_rows']} rows")
        self.stdout.write(
            f"AUC on val ({metrics['val_rows']} rows): "
            + (f"{auc:.3f}" if auc is not None else f"n/a ({metrics.get('auc_val_note')})")
        )
        self.stdout.write("best-of-N on test tasks   random  reranked  oracle  tasks")
        for n, row in metrics["best_of_n"].items():
            if not row["tasks"]:
                self.stdout.write(f"  N={n:<3} no test task has {n} runs")
                continue
            self.stdout.write(
                f"  N={n:<3}                  {row['random']:.3f}   {row['reranked']:.3f}    "
                f"{row['oracle']:.3f}  {row['tasks']:>5}"
            )
        self.stdout.write(
            f"value estimates written on {metrics['scored_steps']} steps of "
            f"{metrics['scored_runs']} runs ({metrics['score_scope']})"
        )
