"""Fleet state in the database: sandbox transitions, leases with fencing tokens, the event log.

These functions never talk to a backend (that is `workers.fleet_ops`, which calls them); each transition
is one conditional UPDATE or a row lock, so two processes can never both move the same sandbox.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

S = Sandbox.State

# Which timestamp a state sets when entered.
_PHASE_FIELD = {
    S.PROVISIONING: "scheduled_at",
    S.WARM: "ready_at",
    S.LEASED: "leased_at",
    S.RELEASED: "released_at",
    S.TERMINATED: "terminated_at",
}


def event_record(*, sandbox: Sandbox, kind: str, reason: str = "", from_state: str = "", to_state: str = "", data=None) -> None:
    SandboxEvent.objects.create(
        sandbox=sandbox, fleet_id=sandbox.fleet_id, kind=kind, from_state=from_state, to_state=to_state,
        reason=reason, data=data or {},
    )


def template_create(*, name: str, **fields) -> EnvironmentTemplate:
    """Templates are immutable: creating one with an existing name makes the next version."""
    with transaction.atomic():
        latest = EnvironmentTemplate.objects.select_for_update().filter(name=name).order_by("-version").first()
        version = latest.version + 1 if latest else 1
        return EnvironmentTemplate.objects.create(name=name, version=version, **fields)


def fleet_create(*, name: str, template: EnvironmentTemplate, **fields) -> Fleet:
    return Fleet.objects.create(name=name, template=template, **fields)


def sandbox_request(*, fleet: Fleet) -> Sandbox:
    """A new row in `requested`; its name is derived from its id so a retried create cannot duplicate."""
    with transaction.atomic():
        sandbox = Sandbox.objects.create(fleet=fleet, name=f"pending-{timezone.now().timestamp()}")
        sandbox.name = f"trove-{fleet.pk}-{sandbox.pk}"
        sandbox.save(update_fields=["name"])
        event_record(sandbox=sandbox, kind="transition", to_state=S.REQUESTED, reason="requested")
    return sandbox


def sandbox_transition(*, sandbox: Sandbox, to: str, expect: tuple[str, ...], reason: str = "", **fields) -> bool:
    """Move `sandbox` to `to` only if it is in one of `expect`. Returns False (and changes nothing) otherwise."""
    now = timezone.now()
    updates = dict(fields, state=to)
    if to in _PHASE_FIELD:
        updates[_PHASE_FIELD[to]] = now
    changed = Sandbox.objects.filter(pk=sandbox.pk, state__in=expect).update(**updates)
    if not changed:
        return False
    from_state = sandbox.state
    for key, value in updates.items():
        setattr(sandbox, key, value)
    event_record(sandbox=sandbox, kind="transition", from_state=from_state, to_state=to, reason=reason)
    return True


def sandbox_claim_warm(*, fleet: Fleet, holder: str, lease_seconds: int) -> Sandbox | None:
    """Lease a warm sandbox in one transaction, never waiting on a backend. None on a miss.

    SKIP LOCKED lets concurrent claimers take different rows instead of queueing behind one.
    """
    with transaction.atomic():
        sandbox = (
            Sandbox.objects.select_for_update(skip_locked=True)
            .filter(fleet=fleet, state=S.WARM)
            .order_by("ready_at", "id")
            .first()
        )
        if sandbox is None:
            return None
        _lease(sandbox, holder=holder, lease_seconds=lease_seconds, reason="warm claim")
    Fleet.objects.filter(pk=fleet.pk).update(claims_hit=F("claims_hit") + 1)
    return sandbox


def sandbox_lease_cold(*, sandbox: Sandbox, holder: str, lease_seconds: int) -> Sandbox:
    """Lease a sandbox this caller just provisioned itself after a miss (counted as a miss)."""
    with transaction.atomic():
        sandbox = Sandbox.objects.select_for_update().get(pk=sandbox.pk)
        sandbox.cold_claim = True
        _lease(sandbox, holder=holder, lease_seconds=lease_seconds, reason="cold claim")
    Fleet.objects.filter(pk=sandbox.fleet_id).update(claims_miss=F("claims_miss") + 1)
    return sandbox


def _lease(sandbox: Sandbox, *, holder: str, lease_seconds: int, reason: str) -> None:
    """Caller holds the row lock."""
    now = timezone.now()
    from_state = sandbox.state
    sandbox.state = S.LEASED
    sandbox.lease_holder = holder
    sandbox.lease_expires_at = now + timedelta(seconds=lease_seconds)
    sandbox.fencing_token = sandbox.fencing_token + 1
    sandbox.leased_at = now
    sandbox.last_used_at = now
    sandbox.save(update_fields=[
        "state", "lease_holder", "lease_expires_at", "fencing_token", "leased_at", "last_used_at", "cold_claim",
    ])
    event_record(sandbox=sandbox, kind="transition", from_state=from_state, to_state=S.LEASED, reason=reason,
                 data={"holder": holder, "fencing_token": sandbox.fencing_token})


def sandbox_check_fence(*, sandbox_id: int, fencing_token: int) -> Sandbox:
    """Raise StaleFencingToken unless the caller's lease is the current one."""
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    if sandbox.state != S.LEASED or sandbox.fencing_token != fencing_token:
        raise StaleFencingToken(
            f"sandbox {sandbox.name}: fencing token {fencing_token} is stale "
            f"(current {sandbox.fencing_token}, state {sandbox.state})"
        )
    return sandbox


def sandbox_heartbeat(*, sandbox_id: int, fencing_token: int, lease_seconds: int) -> bool:
    """Extend the lease; False if the lease is no longer the caller's."""
    now = timezone.now()
    return bool(
        Sandbox.objects.filter(pk=sandbox_id, state=S.LEASED, fencing_token=fencing_token).update(
            lease_expires_at=now + timedelta(seconds=lease_seconds), last_used_at=now
        )
    )


def sandbox_exec_recorded(*, sandbox: Sandbox, command: str, exit_code: int | None, duration_ms: float,
                          reason: str = "", timed_out: bool = False) -> None:
    """Log an exec; the first exec of a lease sets `first_exec_at` (time-to-first-exec is measured from it)."""
    now = timezone.now()
    Sandbox.objects.filter(pk=sandbox.pk, first_exec_at__isnull=True).update(first_exec_at=now)
    Sandbox.objects.filter(pk=sandbox.pk).update(last_used_at=now)
    event_record(sandbox=sandbox, kind="exec", reason=reason,
                 data={"command": command[:500], "exit_code": exit_code, "duration_ms": round(duration_ms, 2),
                       "timed_out": timed_out})
