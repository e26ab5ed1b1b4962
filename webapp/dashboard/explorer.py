"""The trajectory explorer (search, filters, keyset pages, bulk curation) and the import (upload) page.

Thin: a form or the search filters (experience.search, the same vocabulary as the API), a service or
selector, a template. A page of the explorer is one query, whatever the table's size.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import TroveError
from experience.importers import REGISTRY
from experience.models import Trajectory
from experience.search import (
    CLUSTER_OUTCOMES,
    DUPLICATE_CHOICES,
    OUTCOMES,
    Page,
    filters_from_params,
    page_after,
    trajectory_search,
    trajectory_similar,
)
from experience.search_hits import search_hits, trajectory_total
from experience.services.curation import ACTIONS, trajectories_curate
from experience.services.importing import ImportReport, trajectories_import_upload
from experience.services.step_labels import step_label_set
from webapp.access.permissions import scope_required
from webapp.api.ranges import ID_MAX
from webapp.api.trajectories import CURATE_PERMISSION
from webapp.dashboard.forms import form_errors
from webapp.dashboard.saved_filters import saved_filter_menu

PAGE = 50
FILTER_NAMES = ("q", "task", "task_set", "model", "harness", "source", "source_format", "status", "outcome",
                "curation", "duplicate", "tags", "created_after", "created_before", "similar", "ids", "step_label",
                "cluster_outcomes", "job")


# Sortable columns (`sort=reward`, `sort=-reward`): anything but the newest-first default pages by offset.
SORTS = {"id": "id", "task": "task_key", "reward": "reward", "steps": "n_steps", "tokens": "tokens_in",
         "stored": "created_at"}
VIEW_NAMES = ("sort", "density")  # how the page is shown, kept apart from the filters


def _given_filters(data) -> dict[str, str]:
    return {name: data[name] for name in FILTER_NAMES if data.get(name)}


def _view_params(data) -> dict[str, str]:
    view = {name: data[name] for name in VIEW_NAMES if data.get(name)}
    if view.get("sort", "").lstrip("-") not in SORTS:
        view.pop("sort", None)
    if view.get("density") != "compact":
        view.pop("density", None)
    return view


def _sorted_page(queryset, sort: str, offset: int):
    """One page of `queryset` ordered by a column (nulls last, then newest first): one query."""
    column = SORTS[sort.lstrip("-")]
    order = F(column).desc(nulls_last=True) if sort.startswith("-") else F(column).asc(nulls_last=True)
    rows = list(queryset.order_by(order, "-id")[offset: offset + PAGE + 1])
    return Page(rows=rows[:PAGE], next_cursor=offset + PAGE if len(rows) > PAGE else None)


@scope_required("trajectories")
def explorer(request: HttpRequest) -> HttpResponse:
    params, view = _given_filters(request.GET), _view_params(request.GET)
    context: dict = {"params": params, "view": view, "sorts": SORTS, "statuses": Trajectory.Status.values, "outcomes": OUTCOMES,
                     "curations": Trajectory.Curation.values, "duplicates": DUPLICATE_CHOICES, "actions": ACTIONS,
                     "can_curate": request.user.has_perm(CURATE_PERMISSION), "rows": [], "error": "",
                     "step_label_set": step_label_set(), "cluster_outcomes": CLUSTER_OUTCOMES}
    try:
        filters = filters_from_params(params)
        if filters.similar is not None:  # most similar first, one page
            page = Page(rows=trajectory_similar(filters=filters))
        elif view.get("sort", "-id") != "-id":
            page = _sorted_page(trajectory_search(filters=filters), view["sort"], _cursor(request) or 0)
        else:
            page = page_after(trajectory_search(filters=filters), after=_cursor(request), limit=PAGE)
        total = trajectory_total(trajectory_search(filters=filters)) if filters.similar is None else None
    except TroveError as error:
        context["error"] = error.message
        return render(request, "dashboard/explorer.html", context, status=400)
    hits = search_hits(trajectory_ids=[t.pk for t in page.rows], q=filters.q)
    for row in page.rows:
        row.hit = hits.get(row.pk)  # type: ignore[attr-defined]
    shown = {**params, **view}
    context.update(rows=page.rows, filters=filters, first_url=_explorer_url(shown), total=total,
                   saved_filters=saved_filter_menu(user=request.user, params=filters.as_params()),
                   next_url=None if page.next_cursor is None else _explorer_url(shown, after=page.next_cursor),
                   is_first_page=request.GET.get("after") in (None, ""),
                   sort_links=_sort_links(shown, view.get("sort", "-id")),
                   density_url=_explorer_url({**params, **{k: v for k, v in view.items() if k != "density"},
                                              **({} if view.get("density") else {"density": "compact"})}))
    return render(request, "dashboard/explorer.html", context)


def _sort_links(shown: dict[str, str], current: str) -> dict[str, dict[str, str]]:
    """Each sortable header's state (asc, desc or none) and link: descending first, a second click flips."""
    links = {}
    for name in SORTS:
        state = "desc" if current == f"-{name}" else "asc" if current == name else ""
        links[name] = {"state": state, "url": _explorer_url({**shown, "sort": name if state == "desc" else f"-{name}"})}
    return links


def _cursor(request: HttpRequest) -> int | None:
    value = request.GET.get("after")
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise TroveError(f"after: {value!r} is not a page cursor", field="after") from None


def _explorer_url(params: dict[str, str], **extra: object) -> str:
    query = urlencode({**params, **extra})
    return reverse("dashboard:explorer") + (f"?{query}" if query else "")


class CurateForm(forms.Form):
    """The explorer's curation controls. Named apart from the filters (`checked`, `curate_tags`), which the
    same form posts along so "every run matching" means the page's own selection."""

    action = forms.ChoiceField(choices=[(a, a.replace("_", " ")) for a in ACTIONS])
    checked = forms.CharField(required=False)
    selection = forms.ChoiceField(choices=[("checked", "checked runs"), ("matching", "every run matching the filters")],
                                  initial="checked")
    curate_tags = forms.CharField(required=False, help_text="comma-separated")
    note = forms.CharField(required=False)
    reason = forms.CharField(required=False)
    canonical = forms.IntegerField(required=False, min_value=1, max_value=ID_MAX)


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def explorer_curate(request: HttpRequest) -> HttpResponse:
    """Bulk curation from the explorer: the checked runs, or every run matching the page's filters."""
    params = _given_filters(request.POST)
    back = _explorer_url(params)
    if not request.user.has_perm(CURATE_PERMISSION):
        messages.error(request, f"Curation needs the {CURATE_PERMISSION} permission.")
        return redirect(back)
    form = CurateForm({**request.POST.dict(), "checked": ",".join(request.POST.getlist("checked"))})
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(back)
    data = form.cleaned_data
    try:
        result = trajectories_curate(
            trajectories=_selection(data, params), action=data["action"], actor=request.user,
            reason=data["reason"], tags=data["curate_tags"].split(","), note=data["note"],
            canonical_id=data["canonical"])
    except TroveError as error:
        messages.error(request, error.message)
        return redirect(back)
    messages.success(request, f"{data['action'].replace('_', ' ')}: {result.changed} of {result.matched} runs changed.")
    return redirect(back)


def _selection(data: dict, params: dict[str, str]):
    if data["selection"] == "matching":
        return trajectory_search(filters=filters_from_params(params))
    ids = [int(part) for part in data["checked"].split(",") if part.strip().isdigit()]
    if not ids:
        raise TroveError("No runs checked: check some, or choose every run matching the filters.", field="checked")
    return ids


class ImportForm(forms.Form):
    format = forms.ChoiceField(choices=[("", "detect")] + [(k, k) for k in sorted(REGISTRY)], required=False)


@scope_required("trajectories")
def trajectory_import(request: HttpRequest) -> HttpResponse:
    """Upload trajectory files; each is imported all or nothing and the report says what happened."""
    form = ImportForm(request.POST if request.method == "POST" else None)
    report = None
    status = 200
    if request.method == "POST":
        uploads = request.FILES.getlist("file")
        if not uploads:
            form.add_error(None, "Choose at least one file.")
            status = 400
        elif form.is_valid():
            fmt = form.cleaned_data["format"] or None
            report = ImportReport(files=[
                trajectories_import_upload(filename=u.name or "upload", chunks=u.chunks(), format=fmt) for u in uploads
            ])
            status = 200 if report.imported or report.present else 400
    # An upload over TROVE_MAX_BODY_BYTES never gets here: webapp.api.limits refuses it unread.
    return render(request, "dashboard/trajectory_import.html", {
        "form": form, "report": report, "explorer_url": reverse("dashboard:explorer"),
        "max_upload_bytes": settings.TROVE_MAX_BODY_BYTES}, status=status)
