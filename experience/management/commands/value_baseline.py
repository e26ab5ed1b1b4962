"""`manage.py value_baseline VERSION`: train a value model on a value or outcome version.

VERSION is `NAME@N` (or `NAME:N`) or a version id. `--model baseline` (default: a logistic regression
over hashed words and counts) or `--model learned` (frozen MiniLM embeddings with a trained head; needs
the `embeddings` extra). Prints AUC on val, the held-out figures on the test tasks (AUC and calibration
error per decision, AUC per run) and the best-of-N table, stores them on the version's metrics, and writes
per-step value estimates back to the steps of the test-split runs (`--scope all`: every run of the version).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from experience.services.datasets import dataset_version_resolve
from experience.services.value_baseline import BEST_OF, MODELS, SCOPES, value_baseline_run


class Command(BaseCommand):
    help = "Train the baseline value model on a dataset version; report AUC and best-of-N; score the steps."

    def add_arguments(self, parser):
        parser.add_argument("version", help="NAME@N or a version id")
        parser.add_argument("--model", choices=MODELS, default="baseline", help="which value model to train")
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
                version=version, model=options["model"], best_of=options["best_of"], trials=options["trials"], seed=options["seed"],
                scope=options["scope"], aggregate=options["aggregate"],
            )  # fmt: skip
        except TroveError as error:
            raise CommandError(error.message) from None
        self._report(version, metrics)

    def _report(self, version, metrics: dict) -> None:
        auc = metrics["auc_val"]
        self.stdout.write(f"{version}: {metrics['model']} trained on {metrics['train_rows']} rows")
        self.stdout.write(
            f"AUC on val ({metrics['val_rows']} rows): "
            + (f"{auc:.3f}" if auc is not None else f"n/a ({metrics.get('auc_val_note')})")
        )
        self._report_heldout(metrics["heldout"])
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

    def _report_heldout(self, heldout: dict) -> None:
        def figure(value):
            return f"{value:.3f}" if value is not None else "n/a"

        self.stdout.write(
            f"held-out test tasks: {heldout['tasks']} tasks, {heldout['runs']} runs, {heldout['decisions']} decisions"
            f"; AUC {figure(heldout['auc'])} (random 0.500), ECE {figure(heldout['ece'])} per decision"
            f"; AUC {figure(heldout['run_auc'])} per run"
            + (f" ({heldout['note']})" if heldout.get("note") else "")
        )
