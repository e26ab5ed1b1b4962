"""Saved filters in the explorer: save the page's filters under a name (yours alone, or shared), open one
(a link to the explorer with its parameters), delete one of yours. Thin: the form's fields, a service
(experience.services.saved_filters), a redirect back to the explorer with a message."""

from __future__ import annotations

from dataclasses import fields
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import TroveError
from experience.search import TrajectoryFilters
from experience.services.saved_filters import saved_filter_delete, saved_filter_save, saved_filters_visible
from webapp.access.permissions import scope_required

# The explorer's filter names (its FILTER_NAMES; read from the filters themselves, since the explorer
# imports this module for its menu).
FILTER_NAMES = tuple(item.name for item in fields(TrajectoryFilters))


def _explorer_url(params: dict[str, str]) -> str:
    return reverse("dashboard:explorer") + (f"?{urlencode(params)}" if params else "")


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def saved_filter_create(request: HttpRequest) -> HttpResponse:
    params = {name: request.POST[name] for name in FILTER_NAMES if request.POST.get(name)}
    try:
        saved = saved_filter_save(owner=request.user, name=request.POST.get("saved_name", ""), params=params,
                                  shared=request.POST.get("shared") == "on")
    except TroveError as error:
        messages.error(request, error.message)
        return redirect(_explorer_url(params))
    messages.success(request, f"Saved filter {saved.name!r}{' (shared)' if saved.shared else ''}.")
    return redirect(_explorer_url(saved.filters))


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def saved_filter_remove(request: HttpRequest, saved_filter_id: int) -> HttpResponse:
    try:
        saved_filter_delete(owner=request.user, saved_filter_id=saved_filter_id)
    except TroveError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, "Saved filter deleted.")
    return redirect(reverse("dashboard:explorer"))


def saved_filter_menu(*, user, params: dict[str, str]) -> list[dict]:
    """The explorer's menu: each saved filter the user sees, its link, whether it is what the page shows
    now, and whether the user may delete it (their own)."""
    return [{"id": s.pk, "name": s.name, "url": _explorer_url(s.filters), "shared": s.shared,
             "owner": s.owner.get_username(), "mine": s.owner_id == user.pk, "open": s.filters == params}
            for s in saved_filters_visible(user=user)]
