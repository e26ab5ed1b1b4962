"""Fleet pages for ops: the fleet list (with a create form) and a fleet's page (counts by state, warm hit rate,
latency histograms, hold reason, live sandboxes, the event log; forms to scale, drain and move to another
template version). Thin: a form, a service or selector, a template."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experience.errors import NotFound, TroveError
from webapp.access.permissions import scope_required
from webapp.api.ranges import INT_MAX
from webapp.dashboard.confirm import confirmation_page, is_confirmed
from webapp.dashboard.forms import form_errors
from webapp.fleets import selectors, services
from webapp.fleets.models import EnvironmentTemplate, Fleet

LIVE_SANDBOXES_SHOWN = 100


class TemplateChoiceForm(forms.Form):
    """A form with a `template` choice among templates read once by the view (one query, however rendered)."""

    template = forms.TypedChoiceField(coerce=int)

    def __init__(self, *args, templates: list[EnvironmentTemplate], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.templates = {t.pk: t for t in templates}
        field = self.fields["template"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(t.pk, str(t)) for t in templates]

    def clean_template(self) -> EnvironmentTemplate:
        return self.templates[self.cleaned_data["template"]]


class FleetCreateForm(TemplateChoiceForm):
    field_order = ["name", "template"]
    name = forms.CharField(max_length=100)
    backend = forms.ChoiceField(choices=Fleet.Backend.choices)
    min_warm = forms.IntegerField(min_value=0, max_value=INT_MAX, initial=0)
    max_warm = forms.IntegerField(min_value=0, max_value=INT_MAX, initial=4)
    max_total = forms.IntegerField(min_value=0, max_value=INT_MAX, initial=16)
    sizing = forms.ChoiceField(choices=Fleet.Sizing.choices, initial=Fleet.Sizing.BACKLOG)
    miss_policy = forms.ChoiceField(choices=Fleet.MissPolicy.choices, initial=Fleet.MissPolicy.COLD)


class FleetScaleForm(forms.Form):
    min_warm = forms.IntegerField(min_value=0, max_value=INT_MAX)
    max_warm = forms.IntegerField(min_value=0, max_value=INT_MAX)
    max_total = forms.IntegerField(min_value=0, max_value=INT_MAX)
    refill_per_minute = forms.IntegerField(min_value=1, max_value=INT_MAX)


class FleetTemplateForm(TemplateChoiceForm):
    pass


@scope_required("fleets")
def fleet_list(request):
    form = FleetCreateForm(request.POST or None, templates=list(selectors.template_list()))
    if request.method == "POST" and form.is_valid():
        fields = dict(form.cleaned_data)
        try:
            fleet = services.fleet_create(name=fields.pop("name"), template=fields.pop("template"), **fields)
        except TroveError as error:
            form.add_error(error.field if error.field in form.fields else None, error.message)
        else:
            messages.success(request, f"Fleet {fleet.name} created.")
            return redirect("dashboard:fleet", fleet.pk)
    fleets = list(selectors.fleet_list())
    return render(request, "dashboard/fleets.html", {
        "rows": [{"fleet": f, "counts": selectors.state_counts(f)} for f in fleets], "form": form,
    })


@scope_required("fleets")
def fleet_detail(request, fleet_id: int):
    fleet = _fleet_or_404(fleet_id)
    before = request.GET.get("before")
    events, next_before = selectors.fleet_events(fleet=fleet, before=int(before) if before and before.isdigit() else None)
    live = selectors.sandbox_list(fleet_id=fleet.pk, live=True)[:LIVE_SANDBOXES_SHOWN]
    return render(request, "dashboard/fleet.html", {
        "fleet": fleet, "counts": selectors.state_counts(fleet), "latency": selectors.fleet_latencies(fleet=fleet),
        "events": events, "next_before": next_before, "sandboxes": live,
        "scale_form": FleetScaleForm(initial={key: getattr(fleet, key) for key in services.SIZE_FIELDS}),
        "template_form": FleetTemplateForm(initial={"template": fleet.template_id},
                                           templates=list(selectors.template_list())),
    })


@scope_required("fleets")
@require_POST
def fleet_scale(request, fleet_id: int):
    fleet = _fleet_or_404(fleet_id)
    form = FleetScaleForm(request.POST)
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect("dashboard:fleet", fleet.pk)
    shrinking = _shrinking(fleet, form.cleaned_data)
    if shrinking and not is_confirmed(request):
        return confirmation_page(request, title=f"Scale fleet {fleet.name} down", button="Scale it down",
                                 back_url=reverse("dashboard:fleet", args=[fleet.pk]), will=shrinking)
    _apply(request, lambda: services.fleet_scale(fleet=fleet, reason=f"scaled by {request.user}", **form.cleaned_data),
           f"Fleet {fleet.name} scaled.")
    return redirect("dashboard:fleet", fleet.pk)


@scope_required("fleets")
@require_POST
def fleet_drain(request, fleet_id: int):
    fleet = _fleet_or_404(fleet_id)
    if not is_confirmed(request):
        counts = selectors.state_counts(fleet)
        return confirmation_page(request, title=f"Drain fleet {fleet.name}", button="Drain the fleet",
                                 back_url=reverse("dashboard:fleet", args=[fleet.pk]), will=[
            f"stop keeping fleet {fleet.name} warm and creating sandboxes (new rollouts on it wait)",
            f"terminate its {counts.get('warm', 0)} warm sandboxes",
            f"let its {counts.get('leased', 0)} leased sandboxes finish their rollouts",
            "stay drained until someone scales it again"])
    _apply(request, lambda: services.fleet_drain(fleet=fleet, reason=f"drained by {request.user}"),
           f"Fleet {fleet.name} is draining: warm sandboxes go, leased ones finish.")
    return redirect("dashboard:fleet", fleet.pk)


@scope_required("fleets")
@require_POST
def fleet_template(request, fleet_id: int):
    fleet = _fleet_or_404(fleet_id)
    form = FleetTemplateForm(request.POST, templates=list(selectors.template_list()))
    if not form.is_valid():
        messages.error(request, form_errors(form))
        return redirect("dashboard:fleet", fleet.pk)
    template = form.cleaned_data["template"]
    if template != fleet.template and not is_confirmed(request):
        warm = selectors.state_counts(fleet).get("warm", 0)
        return confirmation_page(request, title=f"Move fleet {fleet.name} to {template}", button="Move the fleet",
                                 back_url=reverse("dashboard:fleet", args=[fleet.pk]), will=[
            f"build every new sandbox of fleet {fleet.name} from {template} (now {fleet.template})",
            f"replace its {warm} warm sandboxes built from {fleet.template}, a few at a time, terminating each "
            "once a new one covers it",
            "let leased sandboxes finish their rollouts on the spec they have"])
    _apply(request, lambda: services.fleet_set_template(fleet=fleet, template=template),
           f"Fleet {fleet.name} moves to {template}: warm sandboxes are replaced as new ones come up.")
    return redirect("dashboard:fleet", fleet.pk)


def _shrinking(fleet: Fleet, sizes: dict[str, int]) -> list[str]:
    """What lowering the fleet's sizes ends, one line per size that goes down (none: scaling up or level)."""
    warm = selectors.state_counts(fleet).get("warm", 0)
    lines = []
    if sizes["max_warm"] < fleet.max_warm:
        lines.append(f"lower max_warm from {fleet.max_warm} to {sizes['max_warm']}: warm sandboxes above it are "
                     f"terminated ({max(0, warm - sizes['max_warm'])} of the {warm} warm now)")
    if sizes["min_warm"] < fleet.min_warm:
        lines.append(f"lower min_warm from {fleet.min_warm} to {sizes['min_warm']}: fewer sandboxes kept warm")
    if sizes["max_total"] < fleet.max_total:
        lines.append(f"lower max_total from {fleet.max_total} to {sizes['max_total']}: rollouts past it wait for "
                     "a sandbox")
    return lines


def _fleet_or_404(fleet_id: int) -> Fleet:
    try:
        return selectors.fleet_get(fleet_id=fleet_id)
    except NotFound as error:
        raise Http404(str(error)) from None


def _apply(request, action, success: str) -> None:
    try:
        action()
    except TroveError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, success)


