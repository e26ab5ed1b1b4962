"""The pairwise queue: two runs of the same task side by side (from any explorer filter), "which is better,
and why"; each answer a PairwisePreference that the pairwise dataset kind uses before its automatic pairs.
The step-by-step comparison is the run pages' compare view (/trajectories/compare/), one click away.
A curator here holds the pair shown with the review queues' claim (services.pair_claims), so two curators on
this page never judge the same pair; a reader looks without claiming."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from experience.errors import TroveError
from experience.models import PairwisePreference, ReviewItem, Step
from experience.search import filters_from_params, trajectory_search
from experience.services.pair_claims import adhoc_pair_claim, adhoc_pair_judge
from experience.services.preferences import next_unjudged_pair
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
    can_curate = request.user.has_perm("experience.change_trajectory")
    pair: tuple | None = None  # (A, B) as shown
    claimed_until, all_held = None, False
    try:
        runs = trajectory_search(filters=filters_from_params(params))
        if can_curate:  # a curator takes the pair with a claim; a reader only looks
            item = adhoc_pair_claim(trajectories=runs, user=request.user)
            if item is not None:
                pair, claimed_until = (item.trajectory, item.other), item.claimed_until
            all_held = item is None and next_unjudged_pair(trajectories=runs) is not None
        else:
            pair = next_unjudged_pair(trajectories=runs)
    except TroveError as error:
        messages.error(request, error.message)
    return render(request, "dashboard/pairs.html", {
        "params": params, "sides": _sides(pair), "judged": PairwisePreference.objects.count(),
        "can_curate": can_curate, "claimed_until": claimed_until, "all_held": all_held,
        "claim_minutes": max(1, settings.TROVE_REVIEW_CLAIM_SECONDS // 60),
        "compare_url": (f"{reverse('dashboard:trajectory-compare')}?a={pair[0].pk}&b={pair[1].pk}" if pair else ""),
    })


def _sides(pair) -> list[dict]:
    return [] if pair is None else [{"run": run, "steps": list(
        Step.objects.filter(trajectory_id=run.pk).order_by("seq").values("seq", "kind", "preview")[:STEPS_SHOWN])}
        for run in pair]


def _record(request: HttpRequest) -> None:
    try:
        first, second = int(request.POST.get("a", "")), int(request.POST.get("b", ""))
        item = adhoc_pair_judge(first_id=first, second_id=second, choice=request.POST.get("choice", ""),
                                reason=request.POST.get("reason", ""), user=request.user)
    except ValueError:
        messages.error(request, "a / b: the two runs' ids, please")
    except TroveError as error:
        messages.error(request, error.message)
    else:
        chosen, rejected = ((first, second) if item.decision == ReviewItem.Decision.FIRST else (second, first))
        messages.success(request, f"Run {chosen} preferred to run {rejected}.")
