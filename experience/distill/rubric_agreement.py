"""How well the rubric's detectors agree with hand labels: per label, precision and recall of the step
where the label first holds.

A hand label says, for one run and one rubric label, the step (seq) where the label first holds, or None
when it never does. The detector's answer is the first step after which it reads True. They agree when
both are None, or when both steps belong to the same action: an action is a decision (its model call and
the command or tool call it led to) together with the steps recorded for it before the next decision
(the observation, the workspace diff). Tool harnesses record one act as two or three steps (OpenHands: a
tool call, then its file change), and which of them "is" the edit is a recording convention, not a
judgement; a step in another action is a miss, however close.

Per label: a true positive when both hold at the same action; a false negative when the hand label holds
and the detector fires elsewhere or never; a false positive when the detector fires and the hand label
does not hold there. precision = TP / (TP + FP), None when the detector never fired; recall =
TP / (TP + FN), None when the hand label never holds. `exact=True` scores the exact step instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from experience.distill.decisions import decision_points
from experience.distill.rubric import LABELS, Rubric, rubric
from experience.importers import iter_records
from experience.records import TrajectoryRecord


@dataclass(frozen=True)
class LabelledRun:
    """One hand-labelled run: where it came from, the record, and the hand label of every rubric label."""

    file: str
    index: int
    record: TrajectoryRecord
    labels: dict[str, int | None]


def load_labelled_runs(labels_path: Path, locate: Callable[[str], Path]) -> Iterator[LabelledRun]:
    """The runs a hand-label file names, read with the project's importers. `locate` turns a row's
    `file` into a path. Raises ValueError naming the row when a row lacks a label or names no run."""
    cache: dict[str, list[TrajectoryRecord]] = {}
    for number, line in enumerate(labels_path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        labels = row.get("labels") or {}
        missing = [name for name in LABELS if name not in labels]
        if missing:
            raise ValueError(f"{labels_path.name} line {number}: no hand label for {', '.join(missing)}")
        file = row["file"]
        if file not in cache:
            cache[file] = list(iter_records(locate(file)))
        records = cache[file]
        if not 0 <= row["index"] < len(records):
            raise ValueError(f"{labels_path.name} line {number}: {file} has no run {row['index']}")
        yield LabelledRun(file=file, index=row["index"], record=records[row["index"]], labels=labels)


Detect = Callable[[TrajectoryRecord], Rubric]


def detector_first_steps(record: TrajectoryRecord, detect: Detect = rubric) -> dict[str, int | None]:
    """The first step after which each detector reads True, or None when it never does. `detect` is
    the rubric to score (another version's, for a baseline)."""
    first: dict[str, int | None] = dict.fromkeys(LABELS)
    scored = detect(record)
    for index in range(len(record.steps)):
        for name, value in scored.labels_after(index).items():
            if value and first[name] is None:
                first[name] = index
    return first


def action_of_steps(record: TrajectoryRecord) -> list[int]:
    """For each step, the number of the action it belongs to (0 before the first decision)."""
    starts = {decision.first_step: decision.t for decision in decision_points(record)}
    actions: list[int] = []
    current = 0
    for index in range(len(record.steps)):
        current = starts.get(index, current)
        actions.append(current)
    return actions


@dataclass
class LabelScore:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    misses: list[str] = field(default_factory=list)  # "run: hand X, detector Y", for the report

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    def as_dict(self) -> dict:
        return {
            "precision": _rounded(self.precision),
            "recall": _rounded(self.recall),
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "hand_positives": self.tp + self.fn,
        }


def score(
    runs: Iterable[LabelledRun], *, exact: bool = False, detect: Detect = rubric
) -> dict[str, LabelScore]:
    scores = {name: LabelScore() for name in LABELS}
    for run in runs:
        found = detector_first_steps(run.record, detect)
        actions = action_of_steps(run.record)
        for name in LABELS:
            _score_one(scores[name], run, run.labels[name], found[name], actions, exact)
    return scores


def _score_one(
    entry: LabelScore, run: LabelledRun, hand: int | None, found: int | None, actions: list[int], exact: bool
) -> None:
    if hand is None and found is None:
        return
    if hand is not None and found is not None and _same(hand, found, actions, exact):
        entry.tp += 1
        return
    if hand is not None:
        entry.fn += 1
    if found is not None:
        entry.fp += 1
    entry.misses.append(f"{run.file}#{run.index}: hand {hand}, detector {found}")


def _same(hand: int, found: int, actions: list[int], exact: bool) -> bool:
    if exact or not (0 <= hand < len(actions) and 0 <= found < len(actions)):
        return hand == found
    return actions[hand] == actions[found]


def summary(scores: dict[str, LabelScore], runs: int) -> dict:
    """The figures as one JSON-ready object: per label, and the minimum precision and recall over the
    labels where they are defined."""
    precisions = [s.precision for s in scores.values() if s.precision is not None]
    recalls = [s.recall for s in scores.values() if s.recall is not None]
    return {
        "labels": list(scores),
        "runs": runs,
        "per_label": {name: entry.as_dict() for name, entry in scores.items()},
        "min_precision": _rounded(min(precisions)) if precisions else None,
        "min_recall": _rounded(min(recalls)) if recalls else None,
    }


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None
