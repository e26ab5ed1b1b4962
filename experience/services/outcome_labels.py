"""Labelling stored runs from evaluation reports (experience.importers.reports): a SWE-bench summary or
per-instance report.json, or a JSONL of outcomes. Every change goes through
experience.services.curation.trajectories_outcome_set, so each is a CurationEvent whose reason names the
report and the verdict ("outcomes from <report>: resolved"): audited, and undone like any outcome edit.

Matching: a label naming a trajectory id or a source_ref means that run; one naming a task means the runs
of that task key (and that sample, when given: metadata["sample"]). Where the report names a model or run
(the harness summary's file name, the logs/<run_id>/<model>/ folders, a JSONL line's "model"), the runs
whose model, metadata["run_name"] or source_ref carry one of those names are meant; when none does, every
run of the task is. Only runs in `scope` are labelled (the runs an import just read, or a --filter).

`dry_run=True` matches and counts exactly as a real run would (what would change, what is already so) and
writes nothing: no outcome, no curation event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, QuerySet

from experience.importers.reports import Label, Target
from experience.models import Trajectory
from experience.services.curation import trajectories_outcome_set


@dataclass
class LabelReport:
    """What a report did: runs it labelled (changed), runs it named that already held the label, runs in
    scope it does not mention, its ids that matched no run, and the ids it could not judge (errors)."""

    source: str
    labelled: int = 0
    unchanged: int = 0
    not_mentioned: int = 0
    resolved: int = 0
    unresolved: int = 0
    unmatched: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    trajectory_ids: list[int] = field(default_factory=list)
    dry_run: bool = False  # counted as if applied; nothing written

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("source", "labelled", "unchanged", "not_mentioned",
                                                       "resolved", "unresolved", "unmatched", "not_judged",
                                                       "trajectory_ids", "dry_run")}


@dataclass
class _Run:
    id: int
    task_key: str
    source_ref: str
    model: str
    run_name: Any
    sample: Any

    def carries(self, names: frozenset[str]) -> bool:
        return self.model in names or self.run_name in names or any(n in self.source_ref for n in names)


def trajectories_label_from_report(
    *, labels: Iterable[Label], scope: QuerySet[Trajectory], source: str, actor: Any = None, dry_run: bool = False
) -> LabelReport:
    """Apply a report's labels to the runs of `scope` they name (module docstring). Atomic per verdict."""
    report = LabelReport(source=source, dry_run=dry_run)
    labels = list(labels)
    runs = _runs(scope, labels)
    verdicts: dict[tuple[bool, float | None], list[int]] = defaultdict(list)
    for label in labels:
        if label.success is None:
            report.not_judged.append(label.target.describe())
            continue
        matched = _matching(runs, label)
        if not matched:
            report.unmatched.append(label.target.describe())
        verdicts[(label.success, label.reward)] += [run.id for run in matched]
    for (success, reward), ids in verdicts.items():
        if ids:
            _apply(report, ids, success=success, reward=reward, actor=actor)
    labelled_ids = {i for ids in verdicts.values() for i in ids}
    report.trajectory_ids = sorted(labelled_ids)
    report.not_mentioned = scope.exclude(pk__in=labelled_ids).count()
    return report


def _apply(report: LabelReport, ids: list[int], *, success: bool, reward: float | None, actor: Any) -> None:
    verdict = "resolved" if success else "unresolved"
    values: dict[str, Any] = {"success": success}
    if reward is not None:
        values["reward"] = reward
    if report.dry_run:
        matched, changed = _would_change(sorted(set(ids)), values)
    else:
        result = trajectories_outcome_set(trajectories=sorted(set(ids)), actor=actor,
                                          reason=f"outcomes from {report.source}: {verdict}", **values)
        matched, changed = result.matched, result.changed
    report.labelled += changed
    report.unchanged += matched - changed
    if success:
        report.resolved += matched
    else:
        report.unresolved += matched


def _would_change(ids: list[int], values: dict[str, Any]) -> tuple[int, int]:
    """(runs matched, runs whose outcome would change): trajectories_outcome_set's counts, without writing."""
    rows = list(Trajectory.objects.filter(pk__in=ids).values_list(*values))
    changed = sum(1 for row in rows if any(old != values[name] for old, name in zip(row, values, strict=True)))
    return len(rows), changed


def _runs(scope: QuerySet[Trajectory], labels: list[Label]) -> list[_Run]:
    """The runs of `scope` any label could mean, in one query."""
    ids = {lb.target.trajectory_id for lb in labels if lb.target.trajectory_id is not None}
    refs = {lb.target.source_ref for lb in labels if lb.target.source_ref}
    tasks = {lb.target.task_key for lb in labels if lb.target.task_key}
    wanted = scope.filter(Q(pk__in=ids) | Q(source_ref__in=refs) | Q(task_key__in=tasks))
    rows = wanted.order_by("id").values_list("id", "task_key", "source_ref", "model", "metadata__run_name",
                                             "metadata__sample")
    return [_Run(*row) for row in rows]


def _matching(runs: list[_Run], label: Label) -> list[_Run]:
    target: Target = label.target
    if target.trajectory_id is not None:
        return [r for r in runs if r.id == target.trajectory_id]
    if target.source_ref:
        return [r for r in runs if r.source_ref == target.source_ref]
    found = [r for r in runs if r.task_key == target.task_key
             and (target.sample is None or r.sample == target.sample)]
    if label.names:
        named = [r for r in found if r.carries(label.names)]
        return named or found
    return found


def describe_labels(labels: dict[str, Any]) -> str:
    """A LabelReport (as_dict) as one line for a person: labelled, not mentioned, ids that matched no run."""
    text = (f"{labels['resolved'] + labels['unresolved']} run(s) labelled ({labels['resolved']} resolved, "
            f"{labels['unresolved']} unresolved; {labels['labelled']} changed, {labels['unchanged']} already so), "
            f"{labels['not_mentioned']} run(s) not in the report")
    if labels["unmatched"]:
        shown = ", ".join(labels["unmatched"][:5]) + (", ..." if len(labels["unmatched"]) > 5 else "")
        text += f"; {len(labels['unmatched'])} id(s) matched no run: {shown}"
    if labels["not_judged"]:
        text += f"; {len(labels['not_judged'])} id(s) not judged (evaluation errors), left as they were"
    return text
