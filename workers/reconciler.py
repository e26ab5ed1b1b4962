"""The fleet reconciler: make the backend and the database agree, reap what is done, top up the warm pool.

Runs on Celery beat every few seconds per fleet (and is safe to run concurrently with claims: every
transition it makes is conditional). Order matters: first diff both ways (orphans, lost sandboxes), then
reap (expired leases, lifetime, idle, failed), then top up, counting terminating sandboxes as occupied.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from webapp.fleets import services as fleet_services
from webapp.fleets.models import Fleet, Sandbox
from webapp.rollouts.models import Rollout
from workers import fleet_ops
from workers.sandboxes.base import SandboxError
from workers.sandboxes.registry import get_backend

log = logging.getLogger("trove.fleets")
S = Sandbox.State
HOLD_AFTER_FAILURES = 3
HOLD_COOLDOWN_S = 60
PROVISION_PARALLELISM = 4


def fleet_reconcile(*, fleet: Fleet) -> dict:
    report = {"orphans_deleted": 0, "lost": 0, "reaped": 0, "created": 0, "failed": 0, "hold": ""}
    backend = get_backend(fleet.backend)
    try:
        objects = {h.name: h for h in backend.list({"trove.dev/fleet": str(fleet.pk)})}
    except SandboxError as error:
        _hold(fleet, f"backend unavailable: {error}")
        report["hold"] = fleet.hold_reason
        return report
    rows = {s.name: s for s in fleet.sandboxes.exclude(state=S.TERMINATED)}
    report["orphans_deleted"] = _delete_orphans(fleet, objects, rows)
    report["lost"] = _mark_lost(fleet, objects, rows)
    report["reaped"] = _reap(fleet)
    created, failed = _top_up(fleet)
    report["created"], report["failed"] = created, failed
    report["hold"] = fleet.hold_reason
    return report


def _delete_orphans(fleet: Fleet, objects: dict, rows: dict) -> int:
    """Objects with our fleet label but no live row: a create whose row was lost, or made behind our back."""
    deleted = 0
    for name in objects.keys() - rows.keys():
        get_backend(fleet.backend).destroy(name)
        deleted += 1
        sandbox = fleet.sandboxes.filter(name=name).first()
        if sandbox:
            fleet_services.event_record(sandbox=sandbox, kind="orphan_deleted", reason="object without a live row")
        else:
            log.info("fleet %s: deleted orphan %s (no row at all)", fleet.name, name)
    return deleted


def _mark_lost(fleet: Fleet, objects: dict, rows: dict) -> int:
    """Rows that should have a live object but have none (or a dead one): lost; their lease ends."""
    lost = 0
    for name, sandbox in rows.items():
        if sandbox.state not in (S.WARM, S.LEASED, S.RELEASED):
            continue
        handle = objects.get(name)
        if handle is not None and handle.state not in ("failed", "gone"):
            continue
        reason = "backend object vanished" if handle is None else f"backend reports {handle.state}: {handle.reason}"
        if fleet_services.sandbox_transition(sandbox=sandbox, to=S.LOST, expect=(sandbox.state,), reason=reason,
                                             lease_holder="", lease_expires_at=None):
            lost += 1
            _tell_rollout(sandbox, reason)
            if handle is not None:
                _terminate(sandbox, "lost: cleaning up what is left")
    return lost


def _tell_rollout(sandbox: Sandbox, reason: str) -> None:
    """A rollout using a lost sandbox learns it at its next exec (stale fencing token); note why here."""
    Rollout.objects.filter(sandbox=sandbox, status=Rollout.Status.RUNNING).update(
        error=f"sandbox {sandbox.name} lost: {reason}"
    )


def _reap(fleet: Fleet) -> int:
    now = timezone.now()
    template = fleet.template
    reaped = 0
    candidates = fleet.sandboxes.filter(state__in=(S.WARM, S.LEASED, S.RELEASED, S.FAILED, S.LOST))
    for sandbox in candidates:
        reason = _reap_reason(sandbox, now, template)
        if reason:
            _terminate(sandbox, reason)
            reaped += 1
    return reaped


def _reap_reason(sandbox: Sandbox, now, template) -> str:
    if sandbox.state in (S.FAILED, S.LOST):
        return f"cleanup after {sandbox.state}"
    if sandbox.state == S.LEASED and sandbox.lease_expires_at and sandbox.lease_expires_at < now:
        return f"lease of {sandbox.lease_holder} expired"
    if sandbox.requested_at < now - timedelta(seconds=template.max_lifetime_s):
        return f"over max lifetime ({template.max_lifetime_s} s)"
    idle_since = sandbox.last_used_at or sandbox.ready_at
    if sandbox.state == S.WARM and idle_since and idle_since < now - timedelta(seconds=template.idle_timeout_s):
        return f"idle for more than {template.idle_timeout_s} s"
    if sandbox.state == S.RELEASED:
        return "released"
    return ""


def _terminate(sandbox: Sandbox, reason: str) -> None:
    try:
        fleet_ops.sandbox_terminate(sandbox=sandbox, reason=reason)
    except SandboxError as error:
        log.warning("terminate %s failed (%s); will retry next round", sandbox.name, error)


def warm_target(fleet: Fleet) -> int:
    """Fixed: min_warm. Backlog: queued rollouts predict claims, within [min_warm, max_warm]."""
    if fleet.status == Fleet.Status.DRAINING:
        return 0
    if fleet.sizing == Fleet.Sizing.FIXED:
        return fleet.min_warm
    backlog = Rollout.objects.filter(job__fleet=fleet, status=Rollout.Status.QUEUED).count()
    return max(fleet.min_warm, min(fleet.max_warm, backlog))


def _top_up(fleet: Fleet) -> tuple[int, int]:
    if _holding(fleet):
        return 0, 0
    counts = fleet.sandboxes.filter(state__in=Sandbox.OCCUPYING_STATES).values_list("state", flat=True)
    counts = list(counts)
    ready_or_coming = sum(1 for s in counts if s in (S.WARM, S.REQUESTED, S.PROVISIONING))
    wanted = warm_target(fleet) - ready_or_coming
    room = fleet.max_total - len(counts)  # terminating sandboxes still hold capacity
    budget = _rate_budget(fleet)
    n = max(0, min(wanted, room, budget))
    if wanted > 0 and room <= 0:
        _set_reason(fleet, f"at max_total ({fleet.max_total}): {wanted} warm sandbox(es) short")
    elif n:
        _set_reason(fleet, "")
    return _provision_many(fleet, n) if n else (0, 0)


def _rate_budget(fleet: Fleet) -> int:
    """A sliding one-minute window over sandbox creations, kept in the rows themselves."""
    recent = fleet.sandboxes.filter(requested_at__gte=timezone.now() - timedelta(minutes=1)).count()
    return max(0, fleet.refill_per_minute - recent)


def _provision_many(fleet: Fleet, n: int) -> tuple[int, int]:
    def one(_):
        try:
            fleet_ops.sandbox_provision(fleet=fleet)
            return True
        except SandboxError as error:
            log.warning("fleet %s: provision failed: %s", fleet.name, error)
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=min(n, PROVISION_PARALLELISM)) as pool:
        results = list(pool.map(one, range(n)))
    created, failed = sum(results), results.count(False)
    if failed and not created:
        _maybe_hold(fleet)
    return created, failed


def _maybe_hold(fleet: Fleet) -> None:
    """Several creates failing in a row means more would only churn: hold and show the last reason."""
    recent = list(fleet.sandboxes.order_by("-id").values_list("state", "failure_reason")[:HOLD_AFTER_FAILURES])
    if len(recent) == HOLD_AFTER_FAILURES and all(state in (S.FAILED, S.TERMINATED) and reason
                                                    for state, reason in recent):
        _hold(fleet, f"{HOLD_AFTER_FAILURES} creates failed in a row; last: {recent[0][1][:500]}")


def _hold(fleet: Fleet, reason: str) -> None:
    fleet.status, fleet.hold_reason = Fleet.Status.HOLDING, reason
    Fleet.objects.filter(pk=fleet.pk).update(status=fleet.status, hold_reason=reason)


def _holding(fleet: Fleet) -> bool:
    """A holding fleet retries one create after the cool-down, instead of a burst."""
    if fleet.status != Fleet.Status.HOLDING:
        return False
    last = fleet.sandboxes.order_by("-id").values_list("requested_at", flat=True).first()
    if last and last > timezone.now() - timedelta(seconds=HOLD_COOLDOWN_S):
        return True
    Fleet.objects.filter(pk=fleet.pk).update(status=Fleet.Status.ACTIVE)
    fleet.status = Fleet.Status.ACTIVE
    return False


def _set_reason(fleet: Fleet, reason: str) -> None:
    if fleet.hold_reason != reason:
        fleet.hold_reason = reason
        Fleet.objects.filter(pk=fleet.pk).update(hold_reason=reason)
