"""Step-level labels from curators: a label from the project's label set (settings.TROVE_STEP_LABELS), and a
note, on one step of a run. Stored as a Label row (source `human`, the step set, value {"note": ...}) and a
CurationEvent (`step_label` / `step_unlabel`) naming the step, so a run's curation history shows who labelled
what and why, and a removed label leaves its trace.

Labels that mean a run must not be trained on (settings.TROVE_EXCLUDING_STEP_LABELS, `reward-hack` by
default) leave the run out of every dataset build (`labelled_runs_excluded`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from experience.errors import NotFound, ValidationError
from experience.models import CurationEvent, Label, Step, Trajectory

HUMAN = "human"
NOTE_CHARS = 2000


def step_label_set() -> list[str]:
    """The project's label names, in the order the pages offer them."""
    return list(settings.TROVE_STEP_LABELS)


def excluding_labels() -> list[str]:
    return [name for name in settings.TROVE_EXCLUDING_STEP_LABELS if name in settings.TROVE_STEP_LABELS]


def check_step_label(*, name: str, note: str) -> None:
    if name not in settings.TROVE_STEP_LABELS:
        raise ValidationError(f"label: {name!r} is not in the project's label set ({', '.join(step_label_set())}); "
                              "TROVE_STEP_LABELS configures it", field="label")
    if len(note) > NOTE_CHARS:
        raise ValidationError(f"note: at most {NOTE_CHARS} characters (got {len(note)})", field="note")


def step_label_add(*, trajectory_id: int, seq: int, name: str, note: str = "", actor: Any = None) -> Label:
    """Give step `seq` of the run the label `name` with a note; one Label per (step, name) from curators
    (labelling again replaces the note). Records a CurationEvent. Raises ValidationError / NotFound."""
    note = note.strip()
    check_step_label(name=name, note=note)
    with transaction.atomic():
        step = _step(trajectory_id, seq)
        Trajectory.objects.select_for_update().filter(pk=trajectory_id).first()  # one labeller at a time per run
        previous = Label.objects.filter(trajectory_id=trajectory_id, step_id=step.pk, source=HUMAN, name=name).first()
        if previous is not None:
            before = {"label": name, "seq": seq, "note": (previous.value or {}).get("note", "")}
            previous.value = {"note": note, "by": getattr(actor, "username", "")}
            previous.save(update_fields=["value"])
            label = previous
        else:
            before = {}
            label = Label.objects.create(trajectory_id=trajectory_id, step_id=step.pk, name=name, source=HUMAN,
                                         value={"note": note, "by": getattr(actor, "username", "")})
        CurationEvent.objects.create(trajectory_id=trajectory_id, actor_id=getattr(actor, "pk", None),
                                     action="step_label", before=before,
                                     after={"label": name, "seq": seq, "note": note}, reason=note)
    return label


def step_label_remove(*, trajectory_id: int, seq: int, name: str, actor: Any = None, reason: str = "") -> bool:
    """Take a curator's label off a step. False when the step had no such label. Records a CurationEvent."""
    with transaction.atomic():
        step = _step(trajectory_id, seq)
        found = Label.objects.filter(trajectory_id=trajectory_id, step_id=step.pk, source=HUMAN, name=name).first()
        if found is None:
            return False
        note = (found.value or {}).get("note", "")
        found.delete()
        CurationEvent.objects.create(trajectory_id=trajectory_id, actor_id=getattr(actor, "pk", None),
                                     action="step_unlabel", before={"label": name, "seq": seq, "note": note},
                                     after={}, reason=reason)
    return True


def step_labels_of(*, trajectory_id: int) -> list[dict[str, Any]]:
    """A run's curator step labels, in step order: seq, label, note, who (one query)."""
    rows = (Label.objects.filter(trajectory_id=trajectory_id, source=HUMAN, step__isnull=False)
            .values_list("step__seq", "name", "value", "created_at").order_by("step__seq", "name"))
    return [{"seq": seq, "label": name, "note": (value or {}).get("note", ""), "by": (value or {}).get("by", ""),
             "at": at} for seq, name, value, at in rows]


def runs_with_step_label(name: str) -> QuerySet[Label, Mapping[str, object]]:
    """The trajectory ids of runs having a curator's `name` label on a step (a subquery)."""
    return Label.objects.filter(source=HUMAN, step__isnull=False, name=name).values("trajectory_id")


def labelled_runs_excluded(trajectories: QuerySet[Trajectory]) -> QuerySet[Trajectory]:
    """`trajectories` without the runs a curator gave an excluding label (reward-hack) on any step."""
    names = excluding_labels()
    if not names:
        return trajectories
    return trajectories.exclude(pk__in=Label.objects.filter(source=HUMAN, step__isnull=False, name__in=names)
                                .values("trajectory_id"))


def _step(trajectory_id: int, seq: int) -> Step:
    step = Step.objects.filter(trajectory_id=trajectory_id, seq=seq).only("id").first()
    if step is None:
        raise NotFound(f"run {trajectory_id} has no step {seq}", field="seq")
    return step


# --- rubric overrides ----------------------------------------------------------------------------------------


def rubric_override(*, trajectory_id: int, name: str, value: bool, reason: str, actor: Any = None) -> Label:
    """A curator's verdict on one of the run's rubric labels (experience.distill.rubric.LABELS): a human Label
    without a step, `{"override": value}`, and a `rubric_override` CurationEvent. It wins over the detector in
    dataset rows. Giving another verdict replaces it. A reason is required."""
    from experience.distill.rubric import LABELS

    reason = reason.strip()
    if name not in LABELS:
        raise ValidationError(f"label: {name!r} is not a rubric label ({', '.join(LABELS)})", field="label")
    if not reason:
        raise ValidationError("reason: say why the rubric is wrong here", field="reason")
    if not Trajectory.objects.filter(pk=trajectory_id).exists():
        raise NotFound(f"run {trajectory_id} does not exist", field="trajectory")
    with transaction.atomic():
        found = Label.objects.filter(trajectory_id=trajectory_id, source=HUMAN, step__isnull=True, name=name).first()
        before = {} if found is None else {"label": name, "override": found.value.get("override")}
        if found is None:
            found = Label(trajectory_id=trajectory_id, source=HUMAN, name=name)
        found.value = {"override": bool(value), "reason": reason, "by": getattr(actor, "username", "")}
        found.save()
        CurationEvent.objects.create(trajectory_id=trajectory_id, actor_id=getattr(actor, "pk", None),
                                     action="rubric_override", before=before,
                                     after={"label": name, "override": bool(value)}, reason=reason)
    return found
