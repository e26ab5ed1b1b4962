"""Curators' pairwise preferences: of two runs of the same task, which is better and why. Stored as
PairwisePreference rows with a CurationEvent on each run; the pairwise dataset kind takes them (frozen into
the version when it is requested) before its automatic success-against-failure pairs."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from experience.errors import Conflict, NotFound, ValidationError
from experience.models import CurationEvent, PairwisePreference, Trajectory


def preference_record(*, chosen_id: int, rejected_id: int, reason: str, actor: Any = None) -> PairwisePreference:
    """Record that `chosen_id` did better than `rejected_id`. Both must be runs of the same task; a reason
    is required; a pair already judged (either way round) is a Conflict."""
    reason = reason.strip()
    if not reason:
        raise ValidationError("reason: say why one run is better", field="reason")
    if chosen_id == rejected_id:
        raise ValidationError("rejected: a run cannot be compared with itself", field="rejected")
    runs = {t.pk: t for t in Trajectory.objects.filter(pk__in=[chosen_id, rejected_id]).only("id", "task_key")}
    for pk in (chosen_id, rejected_id):
        if pk not in runs:
            raise NotFound(f"run {pk} does not exist", field="run")
    if runs[chosen_id].task_key != runs[rejected_id].task_key:
        raise ValidationError(f"runs {chosen_id} and {rejected_id} are of different tasks: a preference compares "
                              "two runs of the same task", field="rejected")
    if PairwisePreference.objects.filter(chosen_id=rejected_id, rejected_id=chosen_id).exists():
        raise Conflict(f"runs {chosen_id} and {rejected_id} were already judged the other way", field="chosen")
    try:
        with transaction.atomic():
            preference = PairwisePreference.objects.create(task_key=runs[chosen_id].task_key, chosen_id=chosen_id,
                                                           rejected_id=rejected_id, reason=reason, actor=actor)
            CurationEvent.objects.bulk_create([
                CurationEvent(trajectory_id=pk, actor_id=getattr(actor, "pk", None), action="preference",
                              after={"chosen": chosen_id, "rejected": rejected_id}, reason=reason)
                for pk in (chosen_id, rejected_id)])
    except IntegrityError:
        raise Conflict(f"run {chosen_id} was already preferred to run {rejected_id}", field="chosen") from None
    return preference


def pairwise_preferences() -> list[list[str]]:
    """Every preference as [chosen id, rejected id] (text, as dataset rows name runs), oldest first."""
    return [[str(c), str(r)] for c, r in PairwisePreference.objects.order_by("id").values_list("chosen_id",
                                                                                             "rejected_id")]


def unjudged_pairs(*, trajectories, limit: int) -> list[tuple[int, int]]:
    """Up to `limit` pairs (ids) of two runs of the same task among `trajectories` (a queryset, its newest
    5000 runs) that no preference has judged yet: the tasks with the most runs first, newest runs first."""
    judged = {frozenset(p) for p in PairwisePreference.objects.values_list("chosen_id", "rejected_id")}
    by_task: dict[str, list[int]] = {}
    for pk, task in trajectories.order_by("-id").values_list("pk", "task_key")[:5000]:
        by_task.setdefault(task, []).append(pk)
    pairs: list[tuple[int, int]] = []
    for _task, ids in sorted(by_task.items(), key=lambda item: (-len(item[1]), item[0])):
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if frozenset((a, b)) not in judged:
                    pairs.append((a, b))
                    if len(pairs) >= limit:
                        return pairs
    return pairs


def next_unjudged_pair(*, trajectories) -> tuple[Trajectory, Trajectory] | None:
    """The first of unjudged_pairs, as runs. None when every pair is judged."""
    first = unjudged_pairs(trajectories=trajectories, limit=1)
    if not first:
        return None
    a, b = first[0]
    pair = {t.pk: t for t in Trajectory.objects.filter(pk__in=[a, b])}
    return pair[a], pair[b]
