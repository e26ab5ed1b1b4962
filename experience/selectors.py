"""Reading the store: trajectory lists and the step timeline, with blobs resolved on demand."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from experience.errors import NotFound
from experience.models import Step, Trajectory
from experience.records import StepRecord
from experience.services.stored import stored_step_records

TIMELINE_PAGE = 200


def trajectory_list(*, limit: int | None = None) -> QuerySet[Trajectory]:
    queryset = Trajectory.objects.order_by("-id").defer("instruction", "final_diff", "metadata", "notes")
    return queryset[:limit] if limit else queryset


def trajectory_get(*, trajectory_id: int) -> Trajectory:
    try:
        return Trajectory.objects.get(pk=trajectory_id)
    except Trajectory.DoesNotExist:
        raise NotFound(f"trajectory {trajectory_id} does not exist") from None


@dataclass
class TimelineStep:
    """One step as the replay page draws it: the row, its full content, and its place on the time axis."""

    step: Step
    record: StepRecord
    offset_ms: float | None  # from the trajectory's first step
    width_ms: float
    # Set by the page that draws it: the place on the time axis, in percent of the run's span.
    left_pct: float = 0.0
    width_pct: float = 0.0


def step_records(steps: list[Step]) -> list[StepRecord]:
    """Rebuild full StepRecords for rows (a page of a run will do: contexts stored as deltas on earlier
    steps are completed), fetching every referenced blob in one query."""
    return stored_step_records(steps)


def _width_ms(step: Step) -> float:
    """A step's extent on the time axis: its duration, or its start-to-end span when no duration was given."""
    if step.duration_ms is not None:
        return step.duration_ms
    if step.started_at and step.ended_at:
        return (step.ended_at - step.started_at).total_seconds() * 1000
    return 0.0


def trajectory_timeline(*, trajectory: Trajectory, after_seq: int = -1, limit: int = TIMELINE_PAGE) -> list[TimelineStep]:
    steps = list(Step.objects.filter(trajectory=trajectory, seq__gt=after_seq).order_by("seq")[:limit])
    origin = Step.objects.filter(trajectory=trajectory, started_at__isnull=False).order_by("started_at").values_list(
        "started_at", flat=True).first()
    timeline = []
    for step, record in zip(steps, step_records(steps), strict=True):
        offset = (step.started_at - origin).total_seconds() * 1000 if (origin and step.started_at) else None
        timeline.append(TimelineStep(step=step, record=record, offset_ms=offset, width_ms=_width_ms(step)))
    return timeline


def trajectory_linked_runs(*, trajectory: Trajectory) -> dict[str, list[tuple[int, str]]]:
    """The stored runs an imported run names as its parent (metadata parent_source_ref) and as its subagents
    (subagent_source_refs), as (id, source_ref), in one query. Refs not stored (yet) are left out."""
    metadata = trajectory.metadata or {}
    parent = metadata.get("parent_source_ref")
    children = [r for r in metadata.get("subagent_source_refs") or [] if isinstance(r, str)]
    refs = ([parent] if isinstance(parent, str) else []) + children
    if not refs:
        return {"parent": [], "subagents": []}
    found = dict(Trajectory.objects.filter(source=trajectory.source, source_ref__in=refs)
                 .values_list("source_ref", "id"))
    return {"parent": [(found[parent], parent)] if parent in found else [],
            "subagents": [(found[r], r) for r in children if r in found]}
