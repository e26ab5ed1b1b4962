"""How well the process-rubric detectors agree with hand labels.

The hand labels (tests/fixtures/rubric/hand_labels.jsonl, see the README beside it) give, for each of
72 runs (demo runs of every task and outcome, the real SWE-agent, OpenHands and Inspect runs of the
shared fixtures, and the importers' sample runs) and each rubric label, the step where the label first
holds, or null. Per label this prints the detectors' precision and recall, counting a label found when
the detector first fires within the same action as the hand-labelled step (an action's model call,
command or tool call, and the observation or diff recorded for it: see
experience/distill/rubric_agreement.py), and, for comparison in the same run, the figures at the exact
step. Target: min precision and min recall over the labels at least 0.9. Labels no run holds (by hand)
and no detector fires for have neither figure, and are listed as such.

The last line printed is one JSON object: labels, runs, per-label figures, min_precision, min_recall
(same-action), and the same figures at the exact step under "exact_step".

    .venv/bin/python benchmarks/rubric.py [--misses]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from experience.distill.rubric import RUBRIC_VERSION  # noqa: E402
from experience.distill.rubric_agreement import load_labelled_runs, score, summary  # noqa: E402

LABELS_DIR = REPO / "tests" / "fixtures" / "rubric"
SHARED_DIR = Path(os.environ.get("TROVE_SHARED_DIR") or REPO.parent / "shared")
FIXTURES_DIR = Path(os.environ.get("TROVE_FIXTURES_DIR") or SHARED_DIR / "fixtures" / "trajectories")


def locate(file: str) -> Path:
    """A hand-label row's `file`: `fixtures:` (the shared trajectories), `repo:` (this checkout), or a
    file beside the labels."""
    if file.startswith("fixtures:"):
        return FIXTURES_DIR / file.removeprefix("fixtures:")
    if file.startswith("repo:"):
        return REPO / file.removeprefix("repo:")
    return LABELS_DIR / file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--misses", action="store_true", help="list every disagreement")
    options = parser.parse_args()
    runs = list(load_labelled_runs(LABELS_DIR / "hand_labels.jsonl", locate))
    by_action, by_step = score(runs), score(runs, exact=True)
    print(f"rubric {RUBRIC_VERSION}: {len(runs)} hand-labelled runs")
    print(
        f"{'label':26} {'hand+':>5} {'TP':>4} {'FP':>4} {'FN':>4} {'precision':>10} {'recall':>7}   exact step: P / R"
    )
    for name, entry in by_action.items():
        exact = by_step[name]
        print(
            f"{name:26} {entry.tp + entry.fn:5d} {entry.tp:4d} {entry.fp:4d} {entry.fn:4d} "
            f"{_figure(entry.precision):>10} {_figure(entry.recall):>7}   "
            f"{_figure(exact.precision)} / {_figure(exact.recall)}"
        )
        if options.misses:
            for miss in entry.misses:
                print(f"    {miss}")
    figures = summary(by_action, len(runs))
    figures["rubric_version"] = RUBRIC_VERSION
    figures["tolerance"] = "same action"
    figures["target"] = 0.9
    figures["exact_step"] = {
        k: v
        for k, v in summary(by_step, len(runs)).items()
        if k in ("per_label", "min_precision", "min_recall")
    }
    print(json.dumps(figures))


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
