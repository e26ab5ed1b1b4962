"""Duplicate clusters: a list, one cluster's runs side by side, and a curator's split and merge.

Thin: a form, one service of experience.services.dedup, a template. Reading needs a login; splitting and
merging need the experience.change_trajectory permission (as all curation), and each change is recorded
as a CurationEvent with who, when and why.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import NotFound, TroveError
from experience.services.dedup import (
    OUTCOME_FILTERS,
    cluster_get,
    cluster_list,
    cluster_members,
    cluster_merge,
    cluster_split,
)
from webapp.access.permissions import scope_required
from webapp.api.ranges import ID_MAX
from webapp.api.trajectories import CURATE_PERMISSION
from webapp.dashboard.forms import form_errors

SIDE_BY_SIDE = 12  # members drawn as columns; more would not fit a screen


class ClusterFilterForm(forms.Form):
    outcomes = forms.ChoiceField(
        choices=[("", "any outcomes"), *((name, f"{name} outcomes") for name in OUTCOME_FILTERS)], required=False
    )


class SplitForm(forms.Form):
    trajectory = forms.IntegerField(min_value=1, max_value=ID_MAX)
    reason = forms.CharField(max_length=2000, required=False)


class MergeForm(forms.Form):
    other = forms.IntegerField(min_value=1, max_value=ID_MAX, label="other cluster")
    canonical = forms.IntegerField(min_value=1, max_value=ID_MAX, required=False, help_text="a run of either cluster")
    reason = forms.CharField(max_length=2000, required=False)


@scope_required("trajectories")
def cluster_index(request: HttpRequest) -> HttpResponse:
    """The clusters, optionally only those whose runs' outcomes differ (`?outcomes=mixed`) or agree."""
    form = ClusterFilterForm(request.GET)
    if not form.is_valid():
        return render(request, "dashboard/clusters.html", {"clusters": [], "form": form,
                                                           "error": form_errors(form)}, status=400)
    outcomes = form.cleaned_data["outcomes"] or None
    return render(request, "dashboard/clusters.html", {"clusters": cluster_list(outcomes=outcomes), "form": form})


@scope_required("trajectories")
def cluster_detail(request: HttpRequest, cluster_id: int) -> HttpResponse:
    try:
        cluster = cluster_get(cluster_id=cluster_id)
    except NotFound as error:
        raise Http404(error.message) from None
    members = cluster_members(cluster=cluster)
    return render(request, "dashboard/cluster.html", {
        "cluster": cluster, "members": members[:SIDE_BY_SIDE], "hidden": max(0, len(members) - SIDE_BY_SIDE),
        "can_curate": request.user.has_perm(CURATE_PERMISSION), "merge_form": MergeForm(),
    })


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def cluster_split_view(request: HttpRequest, cluster_id: int) -> HttpResponse:
    form = SplitForm(request.POST)
    return _curate(request, form, lambda data: cluster_split(
        cluster_id=cluster_id, trajectory_id=data["trajectory"], actor=request.user, reason=data["reason"]),
        back=cluster_id, done="split out into cluster {}")


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def cluster_merge_view(request: HttpRequest, cluster_id: int) -> HttpResponse:
    form = MergeForm(request.POST)
    return _curate(request, form, lambda data: cluster_merge(
        cluster_id=cluster_id, other_cluster_id=data["other"], canonical_id=data["canonical"], actor=request.user,
        reason=data["reason"]), back=cluster_id, done="merged into cluster {}")


def _curate(request: HttpRequest, form: forms.Form, act, *, back: int, done: str) -> HttpResponse:
    url = reverse("dashboard:cluster", args=[back])
    if not request.user.has_perm(CURATE_PERMISSION):
        messages.error(request, f"Curation needs the {CURATE_PERMISSION} permission.")
        return redirect(url)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(url)
    try:
        result = act(form.cleaned_data)
    except TroveError as error:
        messages.error(request, error.message)
        return redirect(url)
    messages.success(request, done.format(result.pk))
    return redirect(reverse("dashboard:cluster", args=[result.pk]))
