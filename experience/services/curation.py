"""Curation: approve, reject, reset, tag, untag, note, mark / unmark duplicate, over any selection.

Every change is recorded as a CurationEvent (who, when, what changed from and to, why): one event per
trajectory actually changed (approving an approved run changes nothing and records nothing), written with
bulk_create. The updates themselves are set-based (UPDATE … WHERE id IN a chunk), never per-row saves,
so a curator can act on thousands of runs at once. The selected rows are locked first (SELECT … FOR
UPDATE), so two curators acting on the same runs at once cannot record a "before" that was never true.

`check_curation` validates the request without writing; `trajectories_curate` checks, then does.

Outcomes (reward, success, status) change only here, through `trajectories_outcome_set`: a person's edit
(the admin's action, the API's outcome endpoint) needs a reason, and each run changed gets a `set_outcome`
event holding the old and new values of the fields that changed. `curation_history` reads a run's events.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Case, QuerySet, TextField, Value, When
from django.db.models.functions import Concat
from django.utils import timezone

from experience.errors import NotFound, ValidationError
from experience.models import CurationEvent, Trajectory
from experience.services.dedup import dedup_outcomes_changed

ACTIONS = ("approve", "reject", "reset", "tag", "untag", "note", "mark_duplicate", "unmark_duplicate")
SET_OUTCOME = "set_outcome"
OUTCOME_FIELDS = ("reward", "success", "status")
# A run is `running` only while its runner holds it; a person cannot put it back there.
OUTCOME_STATUSES = tuple(s for s in Trajectory.Status.values if s != Trajectory.Status.RUNNING)
MAX_REASON_CHARS = 2000
_STATUS_OF = {"approve": "approved", "reject": "rejected", "reset": "pending"}
_CHUNK = 2000  # ids per UPDATE (SQLite caps bound parameters) and events per INSERT
MAX_TAG_CHARS = 64


@dataclass(frozen=True)
class CurationResult:
    action: str
    matched: int  # trajectories selected
    changed: int  # trajectories changed, each with one CurationEvent

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "matched": self.matched, "changed": self.changed}


def check_curation(
    *, action: str, tags: Sequence[str] = (), note: str = "", canonical_id: int | None = None
) -> list[str]:
    """Validate a curation request; returns the cleaned tags. Raises ValidationError naming the field."""
    if action not in ACTIONS:
        raise ValidationError(f"action: {action!r} is not one of {', '.join(ACTIONS)}", field="action")
    cleaned = list(dict.fromkeys(t.strip() for t in tags if t and t.strip()))
    if action in ("tag", "untag") and not cleaned:
        raise ValidationError(f"tags: {action} needs at least one tag", field="tags")
    for tag in cleaned:
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationError(f"tags: {tag[:20]!r}… is longer than {MAX_TAG_CHARS} characters", field="tags")
    if action == "note" and not note.strip():
        raise ValidationError("note: the note is empty", field="note")
    if canonical_id is not None and action != "mark_duplicate":
        raise ValidationError("canonical: only mark_duplicate takes a canonical run", field="canonical")
    if canonical_id is not None and not Trajectory.objects.filter(pk=canonical_id).exists():
        raise NotFound(f"canonical: trajectory {canonical_id} does not exist", field="canonical")
    return cleaned


def trajectories_curate(
    *,
    trajectories: QuerySet[Trajectory] | Iterable[int],
    action: str,
    actor: Any = None,
    reason: str = "",
    tags: Sequence[str] = (),
    note: str = "",
    canonical_id: int | None = None,
) -> CurationResult:
    """Apply one curation action to a selection (a queryset, e.g. a search, or ids). Atomic.

    `actor` is the user acting (None for the system). Ids that do not exist are ignored.
    """
    cleaned = check_curation(action=action, tags=tags, note=note, canonical_id=canonical_id)
    selection = _selection(trajectories)
    with transaction.atomic():
        rows = _locked_rows(selection)
        if canonical_id is not None and canonical_id in rows:
            raise ValidationError("canonical: the canonical run cannot be one of the runs marked", field="canonical")
        changes = _plan(action, rows, tags=cleaned, note=note.strip(), canonical_id=canonical_id)
        _apply(action, changes, note=note.strip(), canonical_id=canonical_id)
        _record(action, changes, actor=actor, reason=reason)
        if action in _STATUS_OF:  # the canonical rule prefers approved runs (experience.dedup.canonical)
            dedup_outcomes_changed(trajectory_ids=[c.trajectory_id for c in changes])
    return CurationResult(action=action, matched=len(rows), changed=len(changes))


def _selection(trajectories: QuerySet[Trajectory] | Iterable[int]) -> QuerySet[Trajectory]:
    if isinstance(trajectories, QuerySet):
        # A bare pk subquery: the caller's ordering, deferrals and annotations have no place in FOR UPDATE.
        return Trajectory.objects.filter(pk__in=trajectories.order_by().values("pk"))  # type: ignore[misc]
    ids = sorted({int(i) for i in trajectories})
    return Trajectory.objects.filter(pk__in=ids)


_FIELDS = ("curation_status", "tags", "is_duplicate", "canonical_id")


def _locked_rows(selection: QuerySet[Trajectory]) -> dict[int, dict[str, Any]]:
    rows = selection.select_for_update().order_by("pk").values_list("pk", *_FIELDS)
    return {pk: dict(zip(_FIELDS, values, strict=True)) for pk, *values in rows}


@dataclass(frozen=True)
class _Change:
    trajectory_id: int
    before: dict[str, Any]
    after: dict[str, Any]


def _plan(
    action: str, rows: dict[int, dict[str, Any]], *, tags: list[str], note: str, canonical_id: int | None
) -> list[_Change]:
    changes = []
    for pk, row in rows.items():
        before, after = _before_after(action, row, tags=tags, note=note, canonical_id=canonical_id)
        if before != after or action == "note":
            changes.append(_Change(pk, before, after))
    return changes


def _before_after(
    action: str, row: dict[str, Any], *, tags: list[str], note: str, canonical_id: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    if action in _STATUS_OF:
        return {"curation_status": row["curation_status"]}, {"curation_status": _STATUS_OF[action]}
    if action in ("tag", "untag"):
        old = list(row["tags"] or [])
        new = old + [t for t in tags if t not in old] if action == "tag" else [t for t in old if t not in tags]
        return {"tags": old}, {"tags": new}
    if action == "note":
        return {}, {"note": note}
    duplicate = {"is_duplicate": row["is_duplicate"], "canonical_id": row["canonical_id"]}
    if action == "mark_duplicate":
        return duplicate, {"is_duplicate": True, "canonical_id": canonical_id}
    return duplicate, {"is_duplicate": False, "canonical_id": None}


def _apply(action: str, changes: list[_Change], *, note: str, canonical_id: int | None) -> None:
    now = timezone.now()
    if action in ("tag", "untag"):
        # Rows that had the same tags get the same new tags: one UPDATE per distinct tag list, not per row.
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for change in changes:
            groups[tuple(change.after["tags"])].append(change.trajectory_id)
        for new_tags, ids in groups.items():
            _update(ids, tags=list(new_tags), updated_at=now)
        return
    ids = [c.trajectory_id for c in changes]
    if action in _STATUS_OF:
        _update(ids, curation_status=_STATUS_OF[action], updated_at=now)
    elif action == "note":
        appended = Case(When(notes="", then=Value(note)), default=Concat("notes", Value("\n" + note)),
                        output_field=TextField())
        _update(ids, notes=appended, updated_at=now)
    elif action == "mark_duplicate":
        _update(ids, is_duplicate=True, canonical_id=canonical_id, updated_at=now)
    else:
        _update(ids, is_duplicate=False, canonical_id=None, similarity=None, updated_at=now)


def _update(ids: list[int], **values: Any) -> None:
    for start in range(0, len(ids), _CHUNK):
        Trajectory.objects.filter(pk__in=ids[start : start + _CHUNK]).update(**values)


def _record(action: str, changes: list[_Change], *, actor: Any, reason: str) -> None:
    actor_id = getattr(actor, "pk", None)
    events = (
        CurationEvent(trajectory_id=c.trajectory_id, actor_id=actor_id, action=action,
                      before=c.before, after=c.after, reason=reason)
        for c in changes
    )
    CurationEvent.objects.bulk_create(events, batch_size=_CHUNK)


# --- outcomes ------------------------------------------------------------------------------------------------


class _Keep:
    """The value of an outcome field the caller leaves as it is (None means "clear it")."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


def check_outcome(*, reason: str, reward: Any = KEEP, success: Any = KEEP, status: Any = KEEP) -> dict[str, Any]:
    """Validate an outcome edit; returns the fields to set ({name: value}). Raises ValidationError naming
    the field: a reason is required, and at least one field must be given."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason: an outcome change needs a reason (it is recorded with the change)",
                              field="reason")
    if len(reason) > MAX_REASON_CHARS:
        raise ValidationError(f"reason: longer than {MAX_REASON_CHARS} characters", field="reason")
    given = {name: value for name, value in (("reward", reward), ("success", success), ("status", status))
             if value is not KEEP}
    if not given:
        raise ValidationError("reward: give at least one of reward, success or status", field="reward")
    if "reward" in given:
        given["reward"] = _reward(given["reward"])
    if "success" in given and not (given["success"] is None or isinstance(given["success"], bool)):
        raise ValidationError("success: must be true, false or null", field="success")
    if "status" in given and given["status"] not in OUTCOME_STATUSES:
        raise ValidationError(f"status: {given['status']!r} is not one of {', '.join(OUTCOME_STATUSES)}",
                              field="status")
    return given


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError("reward: must be a finite number or null", field="reward")
    return float(value)


def trajectories_outcome_set(
    *,
    trajectories: QuerySet[Trajectory] | Iterable[int],
    actor: Any,
    reason: str,
    reward: Any = KEEP,
    success: Any = KEEP,
    status: Any = KEEP,
) -> CurationResult:
    """Set the outcome fields given (KEEP leaves one as it is) on a selection, with a reason. Atomic.

    One `set_outcome` CurationEvent per run changed: `before` and `after` hold the fields that changed on
    that run; a run already holding the values records nothing. The rows are locked first, so the
    recorded `before` is what the run held when it changed."""
    values = check_outcome(reason=reason, reward=reward, success=success, status=status)
    selection = _selection(trajectories)
    with transaction.atomic():
        rows = list(selection.select_for_update().order_by("pk").values_list("pk", *values))
        changes = []
        for pk, *current in rows:
            old = dict(zip(values, current, strict=True))
            changed = [name for name in values if old[name] != values[name]]
            if changed:
                changes.append(_Change(pk, {n: old[n] for n in changed}, {n: values[n] for n in changed}))
        _update([c.trajectory_id for c in changes], **values, updated_at=timezone.now())
        _record(SET_OUTCOME, changes, actor=actor, reason=reason.strip())
        # Their clusters' canonicals and duplicate marks follow the new outcomes (after the commit).
        dedup_outcomes_changed(trajectory_ids=[c.trajectory_id for c in changes])
    return CurationResult(action=SET_OUTCOME, matched=len(rows), changed=len(changes))


def curation_history(*, trajectory_id: int) -> QuerySet[CurationEvent]:
    """A run's curation events, newest first, with who made each. Raises NotFound for an unknown run."""
    if not Trajectory.objects.filter(pk=trajectory_id).exists():
        raise NotFound(f"trajectory {trajectory_id} does not exist")
    return CurationEvent.objects.filter(trajectory_id=trajectory_id).select_related("actor").order_by("-id")
