"""Saved explorer filters: a curator names the explorer's current filters to open them again, keeps them to
themselves or shares them. Stored as the canonical query parameters (TrajectoryFilters.as_params), so a
saved filter opens exactly what was saved, and one that no longer parses cannot be saved in the first place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Q, QuerySet

from experience.errors import NotFound, ValidationError
from experience.models import SavedFilter
from experience.search import filters_from_params

NAME_MAX = 100


def saved_filter_save(*, owner: Any, name: str, params: Mapping[str, Any], shared: bool = False) -> SavedFilter:
    """Save `params` (explorer filters) under `name` for `owner`; saving again under one of their names
    replaces it. Raises ValidationError naming the field for no name, a name too long, a bad filter value,
    or no filter at all (every run is the explorer with none, nothing to save)."""
    name = " ".join(name.split())
    if not name:
        raise ValidationError("name: a saved filter needs a name", field="name")
    if len(name) > NAME_MAX:
        raise ValidationError(f"name: at most {NAME_MAX} characters", field="name")
    filters = filters_from_params(params)
    if filters.is_empty():
        raise ValidationError("filters: none chosen; choose some filters first, then save them", field="filters")
    saved, _ = SavedFilter.objects.update_or_create(
        owner=owner, name=name, defaults={"filters": filters.as_params(), "shared": shared})
    return saved


def saved_filter_delete(*, owner: Any, saved_filter_id: int) -> None:
    """Delete one of `owner`'s saved filters. Someone else's (shared or not) is NotFound, as a missing one."""
    deleted, _ = SavedFilter.objects.filter(pk=saved_filter_id, owner=owner).delete()
    if not deleted:
        raise NotFound(f"saved filter {saved_filter_id}: you have no saved filter with that id", field="saved_filter")


def saved_filters_visible(*, user: Any) -> QuerySet[SavedFilter]:
    """The saved filters `user` sees: their own, and those others shared, by name. One query."""
    return SavedFilter.objects.filter(Q(owner=user) | Q(shared=True)).select_related("owner").order_by("name", "id")
