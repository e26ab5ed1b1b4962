"""What the fleet pages and the API read. Each selector runs a fixed number of queries, whatever the data size.
The agent secret is never selected for display: `sandbox_list` / `sandbox_get` defer it."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from experience.errors import NotFound
from webapp.fleets.histograms import Histogram, histogram
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

S = Sandbox.State
STATES = [choice.value for choice in S]
LATENCY_SAMPLE = 1000  # the most recent sandboxes / leases each histogram is drawn from
EVENTS_PAGE = 50


def template_list() -> QuerySet[EnvironmentTemplate]:
    return EnvironmentTemplate.objects.order_by("name", "-version")


def template_get(*, template_id: int) -> EnvironmentTemplate:
    template = EnvironmentTemplate.objects.filter(pk=template_id).first()
    if template is None:
        raise NotFound(f"template: no template {template_id}", field="template")
    return template


def template_latest(*, name: str) -> EnvironmentTemplate:
    template = EnvironmentTemplate.objects.filter(name=name).order_by("-version").first()
    if template is None:
        raise NotFound(f"template: no template named {name!r}", field="template")
    return template


def fleet_list() -> QuerySet[Fleet]:
    """Fleets with their template and a count per sandbox state (`n_<state>`), in one query."""
    counts = {f"n_{state}": Count("sandboxes", filter=Q(sandboxes__state=state)) for state in STATES}
    return Fleet.objects.select_related("template").annotate(**counts).order_by("name")


def fleet_get(*, fleet_id: int) -> Fleet:
    fleet = fleet_list().filter(pk=fleet_id).first()
    if fleet is None:
        raise NotFound(f"fleet: no fleet {fleet_id}", field="fleet")
    return fleet


def state_counts(fleet: Fleet) -> dict[str, int]:
    """From a fleet read through fleet_list/fleet_get: state -> count, for every state."""
    return {state: getattr(fleet, f"n_{state}", 0) for state in STATES}


def fleet_latencies(*, fleet: Fleet, sample: int = LATENCY_SAMPLE) -> dict[str, Histogram]:
    """Histograms of cold start (requested -> ready), claim latency (the claim call, from the lease events)
    and time to first exec (leased -> first exec), over the most recent sandboxes and leases. Three queries."""
    ready = (Sandbox.objects.filter(fleet_id=fleet.pk, ready_at__isnull=False).order_by("-id")
             .values_list("requested_at", "ready_at")[:sample])
    first_exec = (Sandbox.objects.filter(fleet_id=fleet.pk, first_exec_at__isnull=False, leased_at__isnull=False)
                  .order_by("-id").values_list("leased_at", "first_exec_at")[:sample])
    claims = (SandboxEvent.objects.filter(fleet_id=fleet.pk, to_state=S.LEASED).order_by("-id")
              .values_list("data__claim_ms", flat=True)[:sample])
    return {
        "cold_start": histogram([_ms(a, b) for a, b in ready]),
        "claim": histogram([float(v) for v in claims if v is not None]),
        "first_exec": histogram([_ms(a, b) for a, b in first_exec]),
    }


def _ms(start, end) -> float:
    return (end - start).total_seconds() * 1000


def fleet_events(*, fleet: Fleet, before: int | None = None, limit: int = EVENTS_PAGE) -> tuple[list[SandboxEvent], int | None]:
    """A page of the fleet's event log, newest first, and the cursor (`before`) of the next page or None."""
    events = SandboxEvent.objects.filter(fleet_id=fleet.pk)
    if before:
        events = events.filter(id__lt=before)
    page = list(events.order_by("-id")[:limit + 1])
    return page[:limit], (page[limit - 1].pk if len(page) > limit else None)


def sandbox_list(*, fleet_id: int | None = None, states: list[str] | None = None, holder: str = "",
                 live: bool = False) -> QuerySet[Sandbox]:
    sandboxes = Sandbox.objects.select_related("fleet", "template").defer("agent_secret")
    if fleet_id is not None:
        sandboxes = sandboxes.filter(fleet_id=fleet_id)
    if states:
        sandboxes = sandboxes.filter(state__in=states)
    if live:
        sandboxes = sandboxes.exclude(state=S.TERMINATED)
    if holder:
        sandboxes = sandboxes.filter(lease_holder__icontains=holder)
    return sandboxes.order_by("-id")


def sandbox_get(*, sandbox_id: int) -> Sandbox:
    sandbox = sandbox_list().filter(pk=sandbox_id).first()
    if sandbox is None:
        raise NotFound(f"sandbox: no sandbox {sandbox_id}", field="sandbox")
    return sandbox


def sandbox_events(*, sandbox: Sandbox, limit: int = 200) -> list[SandboxEvent]:
    return list(SandboxEvent.objects.filter(sandbox_id=sandbox.pk).order_by("-id")[:limit])
