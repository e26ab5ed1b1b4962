"""The pairwise queue: two runs of the same task side by side (from any explorer filter), "which is better,
and why"; each answer a PairwisePreference that the pairwise dataset kind uses before its automatic pairs.
The step-by-step comparison is the run pages' compare view (/trajectories/compare/), one click away."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from experience.errors import TroveError
from experience.models import PairwisePreference, Step
from experience.search import filters_from_params, trajectory_search
from experience.services.preferences import next_unjudged_pair, preference_record
from webapp.access.permissions import scope_required
from webapp.dashboard.explorer import FILTER_NAMES

STEPS_SHOWN = 60


@scope_required("trajectories", POST="trajectories:curate")
def pairs(request: HttpRequest) -> HttpResponse:
    source = request.POST if request.method == "POST" else request.GET
    params = {name: source[name] for name in FILTER_NAMES if source.get(name)}
    back = reverse("dashboard:pairs") + (f"?{urlencode(params)}" if params else "")
    if request.method == "POST":
        _record(request)
        return redirect(back)
    try:
        pair = next_unjudged_pair(trajectories=trajectory_search(filters=filters_from_params(params)))
    except TroveError as error:
        messages.error(request, error.message)
        pair = None
    sides = [] if pair is None else [{"run": run, "steps": list(
        Step.objects.filter(trajectory_id=run.pk).order_by("seq").values("seq", "kind", "preview")[:STEPS_SHOWN])}
        for run in pair]
    return render(request, "dashboard/pairs.html", {
        "params": params, "sides": sides, "judged": PairwisePreference.objects.count(),
        "can_curate": request.user.has_perm("experience.change_trajectory"),
        "compare_url": (f"{reverse('dashboard:trajectory-compare')}?a={pair[0].pk}&b={pair[1].pk}" if pair else ""),
    })


def _record(request: HttpRequest) -> None:
    try:
        a, b = int(request.POST.get("a", "")), int(request.POST.get("b", ""))
        chosen, rejected = (b, a) if request.POST.get("choice") == "b" else (a, b)
        preference_record(chosen_id=chosen, rejected_id=rejected, reason=request.POST.get("reason", ""),
                          actor=request.user)
    except ValueError:
        messages.error(request, "a / b: the two runs' ids, please")
    except TroveError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Run {chosen} preferred to run {rejected}.")
