"""Review where you read: a run's curation (approve, reject with a reason, tag, note, mark or unmark a
duplicate) and its step labels, posted from the run page's review panel (templates/dashboard/run_review.html,
webapp/static/trove/run_review.js). Thin: a form, a service (experience.services.curation / step_labels), a
redirect back to the run page at the step concerned."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from experience.distill.rubric import LABELS as RUBRIC_LABELS
from experience.errors import TroveError
from experience.models import Trajectory
from experience.services.curation import ACTIONS, trajectories_curate
from experience.services.step_labels import (
    rubric_override,
    step_label_add,
    step_label_remove,
    step_label_set,
    step_labels_of,
)
from webapp.access.permissions import scope_required
from webapp.api.ranges import ID_MAX
from webapp.dashboard.forms import form_errors

RUN_ACTIONS = tuple(action for action in ACTIONS if action != "reset")


class RunCurateForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a.replace("_", " ")) for a in RUN_ACTIONS])
    reason = forms.CharField(required=False, max_length=2000)
    tags = forms.CharField(required=False, help_text="comma-separated")
    note = forms.CharField(required=False, max_length=5000)
    canonical = forms.IntegerField(required=False, min_value=1, max_value=ID_MAX)

    def clean(self):
        data = super().clean()
        if data.get("action") == "reject" and not (data.get("reason") or "").strip():
            self.add_error("reason", "a rejection needs a reason (it is recorded and shown in the run's history)")
        return data


class StepLabelForm(forms.Form):
    seq = forms.IntegerField(min_value=0, max_value=ID_MAX)
    label = forms.CharField(max_length=100)
    note = forms.CharField(required=False, max_length=2000)
    remove = forms.BooleanField(required=False)


def _run_url(trajectory_id: int, seq: int | None = None) -> str:
    return reverse("dashboard:trajectory", args=[trajectory_id]) + (f"#step-{seq}" if seq is not None else "")


def _run_or_404(trajectory_id: int) -> Trajectory:
    run = Trajectory.objects.filter(pk=trajectory_id).only("id").first()
    if run is None:
        raise Http404(f"run {trajectory_id} does not exist")
    return run


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def run_curate(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    run = _run_or_404(trajectory_id)
    form = RunCurateForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect(_run_url(run.pk))
    data = form.cleaned_data
    try:
        result = trajectories_curate(trajectories=[run.pk], action=data["action"], actor=request.user,
                                     reason=data["reason"], tags=data["tags"].split(","), note=data["note"],
                                     canonical_id=data["canonical"])
    except TroveError as error:
        messages.error(request, error.message)
    else:
        done = "changed" if result.changed else "already so: nothing changed"
        messages.success(request, f"Run {run.pk}: {data['action'].replace('_', ' ')} — {done}.")
    return redirect(_run_url(run.pk))


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def step_label(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """Give a step a label from the project's set with a note, or take it off (`remove`). Answers JSON to a
    script (Accept: application/json), else goes back to the run page at that step."""
    run = _run_or_404(trajectory_id)
    form = StepLabelForm(request.POST)
    wants_json = "application/json" in request.headers.get("Accept", "")
    if not form.is_valid():
        return _answer(request, wants_json, run.pk, None, error=form_errors(form))
    data = form.cleaned_data
    try:
        if data["remove"]:
            step_label_remove(trajectory_id=run.pk, seq=data["seq"], name=data["label"], actor=request.user,
                              reason=data["note"])
        else:
            step_label_add(trajectory_id=run.pk, seq=data["seq"], name=data["label"], note=data["note"],
                           actor=request.user)
    except TroveError as error:
        return _answer(request, wants_json, run.pk, data["seq"], error=error.message)
    verb = "removed from" if data["remove"] else "given to"
    return _answer(request, wants_json, run.pk, data["seq"], ok=f"{data['label']} {verb} step {data['seq']}.")


@scope_required("trajectories", POST="trajectories:curate")
@require_POST
def rubric_override_view(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """A curator's verdict on one rubric label of the run (it wins in datasets); a reason is required."""
    run = _run_or_404(trajectory_id)
    value = request.POST.get("value")
    if value not in ("true", "false"):
        messages.error(request, "value: true or false")
        return redirect(_run_url(run.pk))
    try:
        rubric_override(trajectory_id=run.pk, name=request.POST.get("label", ""), value=value == "true",
                        reason=request.POST.get("reason", ""), actor=request.user)
    except TroveError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Rubric label {request.POST['label']} set to {value} for run {run.pk}.")
    return redirect(_run_url(run.pk))


def _answer(request, wants_json: bool, run_id: int, seq: int | None, *, ok: str = "", error: str = "") -> HttpResponse:
    if wants_json:
        return JsonResponse({"ok": not error, "message": error or ok, "labels": step_labels_of(trajectory_id=run_id)},
                            status=400 if error else 200, json_dumps_params={"default": str})
    (messages.error if error else messages.success)(request, error or ok)
    back = request.POST.get("next", "")  # a review queue labels from its own page and goes back there
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        return redirect(back)
    return redirect(_run_url(run_id, seq))


def run_review_context(*, trajectory: Trajectory, user) -> dict:
    """What the run page's review panel reads: the label set, the run's step labels, the curate controls."""
    return {"review_labels": step_label_set(), "review_step_labels": step_labels_of(trajectory_id=trajectory.pk),
            "review_can_curate": user.has_perm("experience.change_trajectory"), "review_actions": RUN_ACTIONS,
            "review_rubric_labels": RUBRIC_LABELS}
