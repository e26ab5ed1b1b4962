"""Review queues in the browser: the list (with progress), making one from the explorer's filters or a random
sample of them, and working one run by run with the keyboard (webapp/static/trove/queue.js): approve, reject
with a reason, skip, next; a label on the current step. A pairs queue shows two runs of a task side by side
instead: A or B is better (with why), or skip. Thin: a form, a service
(experience.services.review_queues), a template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import TroveError
from experience.models import ReviewItem, ReviewQueue, Step
from experience.services import review_queues
from experience.services.step_labels import step_label_set, step_labels_of
from webapp.access.permissions import scope_required
from webapp.dashboard.explorer import FILTER_NAMES
from webapp.dashboard.forms import form_errors

STEPS_SHOWN = 300
PAIR_STEPS_SHOWN = 60  # each side of a pair


class QueueForm(forms.Form):
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=ReviewQueue.Kind.choices, required=False)
    sample = forms.IntegerField(required=False, min_value=1, max_value=review_queues.MAX_ITEMS,
                                help_text="a random sample of this many items; empty: every one matching")


@scope_required("trajectories", POST="trajectories:curate")
def queue_list(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _queue_create(request)
    queues = list(ReviewQueue.objects.filter(adhoc=False).order_by("-id")[:100])  # not /pairs/'s own
    for queue in queues:
        queue.progress = review_queues.queue_progress(queue=queue)  # type: ignore[attr-defined]
    return render(request, "dashboard/queues.html", {"queues": queues})


def _queue_create(request: HttpRequest) -> HttpResponse:
    filters = {name: request.POST[name] for name in FILTER_NAMES if request.POST.get(name)}
    form = QueueForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(reverse("dashboard:queues"))
    try:
        queue = review_queues.queue_create(name=form.cleaned_data["name"], filters=filters,
                                           sample=form.cleaned_data["sample"], actor=request.user,
                                           kind=form.cleaned_data["kind"] or ReviewQueue.Kind.RUNS)
    except TroveError as error:
        messages.error(request, error.message)
        return redirect(reverse("dashboard:queues"))
    count, what = queue.items.count(), "pair" if queue.kind == ReviewQueue.Kind.PAIRS else "run"
    messages.success(request, f"Queue {queue.name} made: {count} {what}{'s' if count != 1 else ''}.")
    return redirect("dashboard:queue", queue.pk)


def _decided(item: ReviewItem, decision: str) -> str:
    if decision == ReviewItem.Decision.FIRST:
        return f"Run {item.trajectory_id} preferred to run {item.other_id}."
    if decision == ReviewItem.Decision.SECOND:
        return f"Run {item.other_id} preferred to run {item.trajectory_id}."
    return f"Run{'s' if item.other_id else ''} {item.trajectory_id}{f' and {item.other_id}' if item.other_id else ''}: {decision}."


def _queue_or_404(queue_id: int) -> ReviewQueue:
    queue = ReviewQueue.objects.filter(pk=queue_id).first()
    if queue is None:
        raise Http404(f"review queue {queue_id} does not exist")
    return queue


@scope_required("trajectories")
def queue_detail(request: HttpRequest, queue_id: int) -> HttpResponse:
    """The user's current run in the queue (their live claim), or a button to take the next one."""
    queue = _queue_or_404(queue_id)
    item = review_queues.queue_current(queue=queue, user=request.user)
    context: dict[str, Any]
    context = {"queue": queue, "item": item, "progress": review_queues.queue_progress(queue=queue),
               "labels": step_label_set(), "can_curate": request.user.has_perm("experience.change_trajectory")}
    if item is not None and item.other is not None:  # a pair: both runs side by side (both select_related)
        context["sides"] = [{"run": run, "steps": _steps(run.pk, PAIR_STEPS_SHOWN)} for run in (item.trajectory, item.other)]
        context["compare_url"] = f"{reverse('dashboard:trajectory-compare')}?a={item.trajectory_id}&b={item.other_id}"
    elif item is not None:
        context["steps"] = _steps(item.trajectory_id, STEPS_SHOWN)
        context["step_labels"] = step_labels_of(trajectory_id=item.trajectory_id)
    return render(request, "dashboard/queue.html", context)


def _steps(trajectory_id: int, limit: int) -> list[Mapping[str, object]]:
    return list(Step.objects.filter(trajectory_id=trajectory_id).order_by("seq").values("seq", "kind", "preview")[:limit])


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def queue_next(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = _queue_or_404(queue_id)
    if review_queues.queue_claim_next(queue=queue, user=request.user) is None:
        messages.success(request, "Nothing left to review in this queue.")
    return redirect("dashboard:queue", queue.pk)


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def queue_decide(request: HttpRequest, queue_id: int, item_id: int) -> HttpResponse:
    """Decide the user's current run, then take the next one for them."""
    queue = _queue_or_404(queue_id)
    item = ReviewItem.objects.filter(pk=item_id, queue=queue).first()
    if item is None:
        raise Http404(f"queue {queue.pk} has no item {item_id}")
    try:
        review_queues.queue_decide(item=item, user=request.user, decision=request.POST.get("decision", ""),
                                   reason=request.POST.get("reason", ""))
    except TroveError as error:
        messages.error(request, error.message)
        return redirect("dashboard:queue", queue.pk)
    messages.success(request, _decided(item, request.POST["decision"]))
    review_queues.queue_claim_next(queue=queue, user=request.user)
    return redirect("dashboard:queue", queue.pk)
