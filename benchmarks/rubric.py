"""How well the process-rubric detectors agree with hand labels, against the previous rubric's.

The hand labels (tests/fixtures/rubric/hand_labels.jsonl, see the README beside it) give, for each of
72 runs (demo runs of every task and outcome, the real SWE-agent, OpenHands and Inspect runs of the
shared fixtures, and the importers' sample runs) and each rubric label, the step where the label first
holds, or null. Per label this prints the detectors' precision and recall, counting a label found when
the detector first fires within the same action as the hand-labelled step (an action's model call,
command or tool call, and the observation or diff recorded for it: see
experience/distill/rubric_agreement.py), and beside them the figures at the exact step. Target: min
precision and min recall over the labels at least 0.9. A label that no run holds by hand and no
detector fires for has neither figure and is left out of the minimums (its row says n/a).

Baseline, measured in the same run: the detectors of `--baseline REV` (default ac903b6, the last
commit of rubric-1), read from git into a scratch package and scored on the same labels; skipped with a
note when git or that commit is not available.

The last line printed is one JSON object: labels, runs, per_label, min_precision, min_recall (same
action), exact_step (the same at the exact step) and baseline (the baseline's figures, or null).

    .venv/bin/python benchmarks/rubric.py [--misses] [--baseline REV | --baseline none]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experience.distill.rubric import RUBRIC_VERSION  # noqa: E402
from experience.distill.rubric_agreement import (  # noqa: E402
    Detect,
    LabelledRun,
    LabelScore,
    load_labelled_runs,
    score,
    summary,
)

LABELS_DIR = REPO / "tests" / "fixtures" / "rubric"
SHARED_DIR = Path(os.environ.get("TROVE_SHARED_DIR") or REPO.parent / "shared")
FIXTURES_DIR = SHARED_DIR / "fixtures" / "trajectories"
BASELINE_REV = "ac903b6"
RUBRIC_MODULES = ("shell", "commands", "rubric")  # what a rubric version is made of


def locate(file: str) -> Path:
    """A hand-label row's `file`: `fixtures:` (the shared trajectories), `repo:` (this checkout), or a
    file beside the labels."""
    if file.startswith("fixtures:"):
        return FIXTURES_DIR / file.removeprefix("fixtures:")
    if file.startswith("repo:"):
        return REPO / file.removeprefix("repo:")
    return LABELS_DIR / file


def baseline_detector(rev: str, scratch: Path) -> tuple[Detect, str] | None:
    """The rubric of commit `rev` (its shell, commands and rubric modules as a package of their own,
    importing each other and the current decisions and records), and its version; None when git cannot
    show them."""
    package = scratch / "baseline_rubric"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in RUBRIC_MODULES:
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:experience/distill/{name}.py"],
            capture_output=True,
            text=True,
        )
        if shown.returncode != 0:
            return None
        source = shown.stdout
        for other in RUBRIC_MODULES:
            source = source.replace(
                f"from experience.distill import {other}", f"from baseline_rubric import {other}"
            )
        source = source.replace(
            "from experience.distill import python_code, shell", "from baseline_rubric import shell"
        )
        (package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(scratch))
    module = importlib.import_module("baseline_rubric.rubric")
    return module.rubric, module.RUBRIC_VERSION


def print_table(
    title: str, by_action: dict[str, LabelScore], by_step: dict[str, LabelScore], misses: bool
) -> None:
    print(title)
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
        if misses:
            for miss in entry.misses:
                print(f"    {miss}")


def figures_of(runs: list[LabelledRun], detect: Detect | None = None) -> tuple[dict, dict, dict]:
    options = {} if detect is None else {"detect": detect}
    by_action, by_step = score(runs, **options), score(runs, exact=True, **options)
    figures = summary(by_action, len(runs))
    figures["exact_step"] = {
        key: value
        for key, value in summary(by_step, len(runs)).items()
        if key in ("per_label", "min_precision", "min_recall")
    }
    return figures, by_action, by_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--misses", action="store_true", help="list every disagreement")
    parser.add_argument(
        "--baseline", default=BASELINE_REV, help="the commit whose rubric is the baseline, or none"
    )
    options = parser.parse_args()
    runs = list(load_labelled_runs(LABELS_DIR / "hand_labels.jsonl", locate))

    figures, by_action, by_step = figures_of(runs)
    figures.update(rubric_version=RUBRIC_VERSION, tolerance="same action", target=0.9, baseline=None)
    print_table(
        f"rubric {RUBRIC_VERSION}: {len(runs)} hand-labelled runs", by_action, by_step, options.misses
    )

    with tempfile.TemporaryDirectory() as scratch:
        found = baseline_detector(options.baseline, Path(scratch)) if options.baseline != "none" else None
        if found is None:
            print(f"\nbaseline: skipped (no rubric at {options.baseline!r})")
        else:
            detect, version = found
            baseline, base_action, base_step = figures_of(runs, detect)
            print()
            print_table(
                f"baseline {version} ({options.baseline}), same labels", base_action, base_step, False
            )
            figures["baseline"] = {"rubric_version": version, "rev": options.baseline} | baseline
    print(json.dumps(figures))


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
