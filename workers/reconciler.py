"""The fleet reconciler: make the backend and the database agree, reap what is done, top the warm pool up.

One round per fleet (Celery beat, every few seconds), in this order:
1. List the backend's objects by the fleet label, then read the fleet's live rows (in that order: a row is
   committed before its object is created, so every listed object made by Trove has its row in the read).
2. Observe: each row against its object (`sandbox_observe`, shared with the `fleet_watch` command):
   provisioning + ready -> adopted (set up, warm); provisioning too long -> failed; live row without an
   object -> lost, its lease ends and its rollout is told (requeued, or infra_error when out of attempts);
   object failed or being deleted under a live row -> failed / lost, likewise; terminating row whose
   object is gone -> terminated.
3. Orphans: an object with the fleet's label and no live row. If its row is terminated, the object outlived
   it (a destroy that half-failed): deleted now. With no row at all it was made behind Trove's back, or by
   another installation sharing the namespace: it is noted (`orphan_seen`) and deleted once it has been
   seen for the grace period (ORPHAN_GRACE_S), which also covers a row whose transaction had not yet
   become visible. Trove never adopts an object it has no row for: it would not know its secret's origin
   or its spec.
4. Reap: expired leases (the holder stopped heartbeating), over max lifetime, idle, a release that never
   finished, a terminating row whose destroy failed (retried).
5. Retire: everything warm when draining; warm sandboxes built from an old template version, rolling (each
   goes once fresh ones cover the warm target without it); warm beyond max_warm.
6. Top up to the warm target (fixed: min_warm; backlog: queued rollouts, within [min_warm, max_warm])
   through the rate limiter (refill_per_minute over a sliding minute of creations), never past max_total,
   counting terminating sandboxes as occupied.
7. Hold instead of churning, with a visible reason on the fleet: a permanent error (bad image, a failing
   setup command, an unsupported network policy) holds until an operator acts (new template version or a
   scale); no capacity (unschedulable pods), a quota, repeated failures and an unreachable backend hold
   with a doubling back-off, after which one probe create is tried; at max_total the reason shows until
   there is room.

Kubernetes creates use `create(wait=False)`: the round never blocks on a pending pod; the row stays
`provisioning` and becomes warm when an observer sees it ready - the next round's list, or sooner the
`manage.py fleet_watch` command, which streams pod changes and applies them with the same `sandbox_observe`.
Local creates take ~0.1 s, so they wait (a bounded thread pool).

Two reconcilers may run at once (beat overlap, two beat hosts): a round first takes a per-fleet Postgres
advisory lock (`pg_try_advisory_lock`) and skips the fleet if it is taken. An advisory lock rather than a
row lock on the fleet, because a round lasts seconds and claims update the fleet row's counters: a row lock
held that long would stall them. The lock dies with the connection, so a killed reconciler frees it.
Within a round every transition is still conditional, so claims, releases and the watch can race it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from experience.services.ingest import trajectory_finish
from webapp.fleets import services as fleet_services
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent
from webapp.rollouts import services as rollout_services
from webapp.rollouts.models import Rollout
from workers import fleet_ops
from workers.sandboxes.base import SandboxError, SandboxHandle
from workers.sandboxes.registry import get_backend

log = logging.getLogger("trove.fleets")
S = Sandbox.State
H = Fleet.HoldKind
Enqueue = Callable[[int], None]

ORPHAN_GRACE_S = 60.0
RELEASED_GRACE_S = 30.0
TERMINATING_RETRY_S = 30.0
CREATOR_MARGIN_S = 30.0  # a creator that waits gets this long past the provision timeout before observers step in
HOLD_AFTER_FAILURES = 3
HOLD_MIN_S, HOLD_MAX_S = 30.0, 600.0
PROVISION_PARALLELISM = 4
LOCK_CLASS = 0x7472  # first key of the advisory lock ("tr"); the second is the fleet id
TRANSIENT_HOLDS = (H.CAPACITY, H.QUOTA, H.FAILURES, H.BACKEND)
UNSCHEDULABLE = "Unschedulable"


@dataclass
class Report:
    adopted: int = 0
    failed: int = 0
    lost: int = 0
    orphans_seen: int = 0
    orphans_deleted: int = 0
    reaped: int = 0
    retired: int = 0
    created: int = 0
    create_failed: int = 0
    warm_target: int = 0
    hold: str = ""
    skipped: str = ""
    notes: list[str] = field(default_factory=list)


# --- entry points ----------------------------------------------------------------------------------------

def fleet_reconcile(*, fleet: Fleet | None = None, fleet_id: int | None = None,
                    orphan_grace_s: float = ORPHAN_GRACE_S, enqueue: Enqueue | None = None) -> dict:
    """One round for one fleet; returns what it did. Skips (report["skipped"]) if another reconciler holds
    the fleet. `enqueue` re-sends a rollout taken back from a lost sandbox (default: by task name)."""
    fleet_id = fleet_id if fleet_id is not None else fleet.pk  # type: ignore[union-attr]
    with fleet_lock(fleet_id) as held:
        if not held:
            return asdict(Report(skipped="another reconciler holds this fleet"))
        current = Fleet.objects.select_related("template").get(pk=fleet_id)
        report = _Round(current, orphan_grace_s, enqueue or rollout_services.enqueue_by_name).run()
        Fleet.objects.filter(pk=fleet_id).update(reconciled_at=timezone.now(), last_report=asdict(report))
    return asdict(report)


@contextmanager
def fleet_lock(fleet_id: int) -> Iterator[bool]:
    """Yield True if this process now holds the fleet's reconciler lock, False if someone else does."""
    if connection.vendor != "postgresql":  # the embedded default: one process, so a process-local lock
        lock = _local_locks.setdefault(fleet_id, threading.Lock())
        held = lock.acquire(blocking=False)
        try:
            yield held
        finally:
            if held:
                lock.release()
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, fleet_id])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, fleet_id])


_local_locks: dict[int, threading.Lock] = {}


def warm_target(fleet: Fleet) -> int:
    """Fixed: min_warm. Backlog: rollouts about to claim (queued, or running without a sandbox yet) predict
    claims before they arrive; the target follows them within [min_warm, max_warm]. Draining: 0."""
    if fleet.status == Fleet.Status.DRAINING:
        return 0
    if fleet.sizing == Fleet.Sizing.FIXED:
        return fleet.min_warm
    backlog = Rollout.objects.filter(job__fleet_id=fleet.pk).filter(
        Q(status=Rollout.Status.QUEUED) | Q(status=Rollout.Status.RUNNING, sandbox__isnull=True)).count()
    return max(fleet.min_warm, min(fleet.max_warm, backlog))


# --- observing one sandbox (shared with fleet_watch) ----------------------------------------------------

def sandbox_observe(*, sandbox: Sandbox, handle: SandboxHandle | None, seen_at: datetime,
                    enqueue: Enqueue | None = None) -> str:
    """Apply one backend observation (`handle`, None when the backend has no such object) to the row.
    `seen_at` is when the observation was taken: a row that became live after it is not judged by it.
    Returns what happened ("" for nothing)."""
    state = sandbox.state
    if state == S.TERMINATING:
        return _observe_terminating(sandbox, handle)
    if state in (S.REQUESTED, S.PROVISIONING):
        return _observe_starting(sandbox, handle, seen_at)
    if state in (S.WARM, S.LEASED, S.RELEASED) and sandbox.ready_at and sandbox.ready_at < seen_at:
        return _observe_live(sandbox, handle, enqueue or rollout_services.enqueue_by_name)
    return ""


def _observe_terminating(sandbox: Sandbox, handle: SandboxHandle | None) -> str:
    if handle is None:
        moved = fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATED, expect=(S.TERMINATING,),
                                                  reason="backend object gone")
        return "terminated" if moved else ""
    if handle.state != "terminating" and _terminating_for(sandbox) > TERMINATING_RETRY_S:
        try:
            fleet_ops.sandbox_destroy(sandbox=sandbox)
        except SandboxError:
            return ""
        return "destroy_retried"
    return ""


def _terminating_for(sandbox: Sandbox) -> float:
    since = (SandboxEvent.objects.filter(sandbox=sandbox, to_state=S.TERMINATING).order_by("-id")
             .values_list("created_at", flat=True).first())
    return (timezone.now() - since).total_seconds() if since else float("inf")


def _observe_starting(sandbox: Sandbox, handle: SandboxHandle | None, seen_at: datetime) -> str:
    expect = (S.REQUESTED, S.PROVISIONING)
    if handle is not None and handle.state == "failed":
        permanent = bool(handle.details.get("permanent"))
        error = SandboxError(f"backend reports {handle.reason}: {handle.details.get('message', '')}".strip(),
                             reason=handle.reason or "failed", permanent=permanent)
        if fleet_ops.sandbox_fail(sandbox=sandbox, error=error, expect=expect):
            if permanent:
                _hold(sandbox.fleet, H.PERMANENT, f"sandbox {sandbox.name}: {error}")
            return "failed"
        return ""
    if _overdue(sandbox, seen_at):
        detail = f"{handle.state}: {handle.reason}" if handle is not None else "no backend object"
        timeout = sandbox.fleet.provision_timeout_s
        return "failed" if fleet_ops.sandbox_fail(
            sandbox=sandbox, error=f"not ready within {timeout} s ({detail})", expect=expect) else ""
    if handle is None or sandbox.creator_waits:
        return ""  # not created yet, or its creator is waiting for it and will finish the job
    if handle.state in ("terminating", "gone"):
        moved = fleet_ops.sandbox_fail(sandbox=sandbox, error="backend object deleted while starting", expect=expect)
        return "failed" if moved else ""
    if handle.state == "ready":
        if fleet_ops.sandbox_adopt(sandbox=sandbox, handle=handle):
            _unhold_transient(sandbox.fleet, f"sandbox {sandbox.name} came up")
            return "adopted"
        return ""
    _note_backend_reason(sandbox, handle)
    return "unschedulable" if handle.reason == UNSCHEDULABLE else ""


def _overdue(sandbox: Sandbox, now: datetime) -> bool:
    since = sandbox.scheduled_at or sandbox.requested_at
    limit = sandbox.fleet.provision_timeout_s + (CREATOR_MARGIN_S if sandbox.creator_waits else 0)
    return since is not None and (now - since).total_seconds() > limit


def _note_backend_reason(sandbox: Sandbox, handle: SandboxHandle) -> None:
    """Keep the backend's word on a pending sandbox (Unschedulable, ContainerCreating) visible; log changes."""
    text = f"{handle.reason}: {handle.details.get('message', '')}".strip(": ") if handle.reason else ""
    if text and text != sandbox.backend_reason:
        Sandbox.objects.filter(pk=sandbox.pk).update(backend_reason=text[:2000])
        sandbox.backend_reason = text
        fleet_services.event_record(sandbox=sandbox, kind="observed", reason=text, data={"state": handle.state})


def _observe_live(sandbox: Sandbox, handle: SandboxHandle | None, enqueue: Enqueue) -> str:
    if handle is not None and handle.state in ("ready", "provisioning"):
        return ""
    if handle is None or handle.state in ("terminating", "gone"):
        to, why = S.LOST, "backend object vanished" if handle is None else "backend object deleted behind our back"
    else:
        to, why = S.FAILED, f"backend reports {handle.state}: {handle.reason}"
    lease_state = sandbox.state
    if not fleet_ops.sandbox_fail(sandbox=sandbox, error=why, expect=(lease_state,), to=to):
        return ""
    if lease_state == S.LEASED:
        _tell_rollout(sandbox, f"sandbox {sandbox.name} {to}: {why}", enqueue)
    return "lost" if to == S.LOST else "died"


def _tell_rollout(sandbox: Sandbox, error: str, enqueue: Enqueue) -> None:
    """Take the attempt back from the rollout that held the sandbox: requeued while attempts remain (and sent
    again after commit), else infra_error. Its worker learns at its next heartbeat or exec (stale token)."""
    rollout = Rollout.objects.filter(sandbox_id=sandbox.pk, status=Rollout.Status.RUNNING).first()
    if rollout is None:
        return
    outcome = ""
    if rollout.attempt < settings.TROVE_ROLLOUT_MAX_ATTEMPTS and rollout_services.rollout_requeue(
            rollout_id=rollout.pk, worker=rollout.worker, error=error):
        outcome = "requeued"
        transaction.on_commit(lambda: enqueue(rollout.pk))
    elif rollout_services.rollout_finish(rollout_id=rollout.pk, worker=rollout.worker,
                                         status=Rollout.Status.INFRA_ERROR, error=error):
        outcome = "infra_error"
    if not outcome:
        return
    if rollout.trajectory_id:  # the partial trajectory stays as evidence, out of training data
        trajectory_finish(trajectory_id=rollout.trajectory_id, status="infra_error")
    fleet_services.event_record(sandbox=sandbox, kind="rollout_told", reason=error,
                                data={"rollout": rollout.pk, "outcome": outcome})


# --- holds -----------------------------------------------------------------------------------------------

def _hold(fleet: Fleet, kind: str, reason: str) -> None:
    """Permanent holds wait for an operator; transient ones back off, doubling while the hold lasts."""
    if kind == H.PERMANENT:
        retry: float | None = None
    elif kind == H.MAX_TOTAL:
        retry = 0.0  # re-checked every round
    elif fleet.status == Fleet.Status.HOLDING and fleet.held_at:
        retry = min(HOLD_MAX_S, max(HOLD_MIN_S, 2 * (timezone.now() - fleet.held_at).total_seconds()))
    else:
        retry = HOLD_MIN_S
    fleet_services.fleet_hold(fleet=fleet, kind=kind, reason=reason, retry_in_s=retry)


def _unhold_transient(fleet: Fleet, reason: str) -> None:
    if fleet.status == Fleet.Status.HOLDING and fleet.hold_kind in (*TRANSIENT_HOLDS, H.MAX_TOTAL):
        fleet_services.fleet_unhold(fleet=fleet, reason=reason)


def _hold_kind_for(error: SandboxError) -> str:
    if error.permanent:
        return H.PERMANENT
    return H.QUOTA if error.reason == "quota" else H.FAILURES


# --- one round -------------------------------------------------------------------------------------------

class _Round:
    def __init__(self, fleet: Fleet, orphan_grace_s: float, enqueue: Enqueue) -> None:
        self.fleet, self.orphan_grace_s, self.enqueue = fleet, orphan_grace_s, enqueue
        self.backend = get_backend(fleet.backend)
        self.report = Report()
        self.rows: list[Sandbox] = []

    def run(self) -> Report:
        self._ensure_policy()
        seen_at = timezone.now()
        objects = self._list()
        if objects is None:
            return self._done()
        self.rows = self._live_rows()
        outcomes = [sandbox_observe(sandbox=s, handle=objects.get(s.name), seen_at=seen_at, enqueue=self.enqueue)
                    for s in self.rows]
        self._count(outcomes)
        self._orphans(objects, seen_at)
        self._reap()
        self._retire()
        self._top_up(unschedulable=outcomes.count("unschedulable"))
        return self._done()

    def _done(self) -> Report:
        self.fleet.refresh_from_db(fields=["status", "hold_kind", "hold_reason", "held_at", "hold_until"])
        self.report.hold = self.fleet.hold_reason if self.fleet.status == Fleet.Status.HOLDING else ""
        return self.report

    def _count(self, outcomes: list[str]) -> None:
        self.report.adopted = outcomes.count("adopted")
        self.report.failed = outcomes.count("failed")
        self.report.lost = outcomes.count("lost") + outcomes.count("died")

    # -- backend ------------------------------------------------------------------------------------------

    _policies: dict[tuple[int, int], str] = {}  # (backend, fleet) -> spec hash applied, per process

    def _ensure_policy(self) -> None:
        """Kubernetes: the fleet's NetworkPolicy (egress only to the proxy, or nothing), once per spec and
        process. A failure holds the fleet (no new sandboxes without their policy); the round goes on."""
        ensure = getattr(self.backend, "ensure_fleet_policy", None)
        key, template = (id(self.backend), self.fleet.pk), self.fleet.template
        if ensure is None or self._policies.get(key) == template.spec_hash:
            return
        try:
            ensure(str(self.fleet.pk), network=template.network, proxy_pod_labels=PROXY_POD_LABELS,
                   proxy_namespace_labels=PROXY_NAMESPACE_LABELS)
        except SandboxError as error:
            _hold(self.fleet, H.PERMANENT if error.permanent else H.BACKEND, f"network policy: {error}")
            return
        self._policies[key] = template.spec_hash

    def _list(self) -> dict[str, SandboxHandle] | None:
        try:
            objects = {h.name: h for h in self.backend.list(fleet_ops.fleet_labels(self.fleet.pk))}
        except SandboxError as error:
            _hold(self.fleet, H.BACKEND, f"backend unavailable: {error}")
            return None
        if self.fleet.status == Fleet.Status.HOLDING and self.fleet.hold_kind == H.BACKEND:
            fleet_services.fleet_unhold(fleet=self.fleet, reason="backend answers again")
        return objects

    def _live_rows(self) -> list[Sandbox]:
        rows = list(self.fleet.sandboxes.exclude(state=S.TERMINATED).select_related("template").order_by("id"))
        for row in rows:
            row.fleet = self.fleet
        return rows

    # -- orphans ------------------------------------------------------------------------------------------

    def _orphans(self, objects: dict[str, SandboxHandle], seen_at: datetime) -> None:
        live = {s.name for s in self.rows}
        unknown = {name: h for name, h in objects.items() if name not in live and h.state not in ("terminating", "gone")}
        ended = {s.name: s for s in Sandbox.objects.filter(fleet_id=self.fleet.pk, name__in=list(unknown))}
        sightings = {n: t for n, t in self.fleet.orphans_seen.items() if n in unknown}
        for name in unknown:
            row = ended.get(name)
            if row is not None:
                if row.terminated_at and row.terminated_at < seen_at:
                    self._delete_orphan(name, row=row, why="object outlived its terminated row")
                continue
            if name not in sightings:
                sightings[name] = seen_at.isoformat()
                self.report.orphans_seen += 1
                fleet_services.event_record(kind="orphan_seen", fleet_id=self.fleet.pk, sandbox_name=name,
                                            reason=f"object with the fleet's label and no row; deleted after "
                                                   f"{self.orphan_grace_s:g} s unless a row appears")
            age = (seen_at - datetime.fromisoformat(sightings[name])).total_seconds()
            if age >= self.orphan_grace_s and self._delete_orphan(
                    name, row=None, why=f"object without a row for {self.orphan_grace_s:g} s"):
                sightings.pop(name)
        if sightings != self.fleet.orphans_seen:
            Fleet.objects.filter(pk=self.fleet.pk).update(orphans_seen=sightings)
            self.fleet.orphans_seen = sightings

    def _delete_orphan(self, name: str, *, row: Sandbox | None, why: str) -> bool:
        try:
            self.backend.destroy(name)
        except SandboxError as error:
            log.warning("fleet %s: could not delete orphan %s: %s", self.fleet.name, name, error)
            return False
        self.report.orphans_deleted += 1
        fleet_services.event_record(kind="orphan_deleted", sandbox=row, fleet_id=self.fleet.pk, sandbox_name=name,
                                    reason=why)
        return True

    # -- reaping and retiring ---------------------------------------------------------------------------

    def _reap(self) -> None:
        now = timezone.now()
        for sandbox in self.rows:
            reason = _reap_reason(sandbox, now)
            if not reason:
                continue
            where = {"lease_expires_at__lt": now} if reason.startswith("lease of") else None
            if self._terminate(sandbox, reason, where=where):
                self.report.reaped += 1

    def _retire(self) -> None:
        warm = [s for s in self.rows if s.state == S.WARM]
        if self.fleet.status == Fleet.Status.DRAINING:
            pending = [s for s in self.rows if s.state in (S.REQUESTED, S.PROVISIONING) and not s.cold_claim]
            for sandbox in warm + pending:
                self.report.retired += self._terminate(sandbox, "fleet draining")
            return
        for sandbox in _to_retire(self.fleet, warm, self._coming(), self._room()):
            self.report.retired += self._terminate(sandbox, _retire_reason(self.fleet, sandbox))

    def _terminate(self, sandbox: Sandbox, reason: str, where: dict | None = None) -> bool:
        """Terminate from the state this round saw, so a sandbox claimed meanwhile is left alone."""
        if not fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATING, expect=(sandbox.state,),
                                                 where=where, reason=reason, lease_holder="", lease_expires_at=None):
            return False
        try:
            fleet_ops.sandbox_destroy(sandbox=sandbox)
        except SandboxError as error:
            log.warning("fleet %s: destroy of %s failed (%s); retried later", self.fleet.name, sandbox.name, error)
        return True

    # -- topping up -----------------------------------------------------------------------------------------

    def _counts(self) -> dict[str, int]:
        """Occupying rows by state, read fresh (this round has just reaped and retired)."""
        counts: dict[str, int] = {}
        for state in self.fleet.sandboxes.filter(state__in=Sandbox.OCCUPYING_STATES).values_list("state", flat=True):
            counts[state] = counts.get(state, 0) + 1
        return counts

    def _coming(self) -> int:
        spec = self.fleet.template.spec_hash
        return sum(1 for s in self.rows if s.state in (S.REQUESTED, S.PROVISIONING) and not s.cold_claim
                   and s.spec_hash == spec)

    def _room(self) -> int:
        return self.fleet.max_total - sum(self._counts().values())

    def _top_up(self, *, unschedulable: int) -> None:
        if self.fleet.status == Fleet.Status.DRAINING:
            return
        target = self.report.warm_target = warm_target(self.fleet)
        fresh = self.fleet.sandboxes.filter(state=S.WARM, spec_hash=self.fleet.template.spec_hash).count()
        wanted = target - fresh - self._coming()
        if unschedulable:  # more pods would only queue behind these
            _hold(self.fleet, H.CAPACITY, f"no capacity: {unschedulable} sandbox(es) unschedulable "
                                          f"({self._unschedulable_reason()})")
            return
        if wanted <= 0:
            if self.fleet.hold_kind == H.MAX_TOTAL:
                fleet_services.fleet_unhold(fleet=self.fleet, reason="warm target met")
            return
        n = self._allowed(wanted)
        if n > 0:
            self._provision(n)

    def _unschedulable_reason(self) -> str:
        reasons = [s.backend_reason for s in self.rows if s.backend_reason.startswith(UNSCHEDULABLE)]
        return reasons[0][:300] if reasons else UNSCHEDULABLE

    def _allowed(self, wanted: int) -> int:
        """How many to create now: held fleets create nothing, or one probe once the back-off has passed."""
        fleet, now = self.fleet, timezone.now()
        if fleet.status == Fleet.Status.HOLDING and fleet.hold_kind != H.MAX_TOTAL:
            if fleet.hold_kind == H.PERMANENT or (fleet.hold_until and fleet.hold_until > now):
                return 0
            wanted = 1  # a probe; the hold stays (and its back-off grows) until a sandbox comes up
            _hold(fleet, fleet.hold_kind, fleet.hold_reason)
        room = self._room()
        if room <= 0:
            _hold(fleet, H.MAX_TOTAL, f"at max_total ({fleet.max_total}): {wanted} warm sandbox(es) short")
            return 0
        if fleet.hold_kind == H.MAX_TOTAL:
            fleet_services.fleet_unhold(fleet=fleet, reason="room under max_total again")
        budget = _rate_budget(fleet)
        if budget <= 0:
            self.report.notes.append(f"rate limited: {fleet.refill_per_minute}/min reached")
        return max(0, min(wanted, room, budget))

    def _provision(self, n: int) -> None:
        wait = self.fleet.backend != Fleet.Backend.KUBERNETES  # never block a round on a pending pod
        rows = fleet_services.sandboxes_request(fleet=self.fleet, n=n, creator_waits=wait)
        errors = _create_all(rows, wait)
        failures = [e for e in errors if e is not None]
        self.report.created, self.report.create_failed = len(rows) - len(failures), len(failures)
        if failures:
            self._hold_after(failures)
        elif rows and wait:
            _unhold_transient(self.fleet, f"{len(rows)} sandbox(es) came up")

    def _hold_after(self, failures: list[SandboxError]) -> None:
        worst = next((e for e in failures if e.permanent), failures[0])
        kind = _hold_kind_for(worst)
        if kind == H.FAILURES and not _failing_in_a_row(self.fleet):
            return
        _hold(self.fleet, kind, f"create failed: {worst.reason}: {worst}")


def _create_all(rows: list[Sandbox], wait: bool) -> list[SandboxError | None]:
    """Create in a bounded pool of threads, each on its own connection; in this thread when the caller is
    inside a transaction (other connections could not see the rows yet)."""
    if len(rows) < 2 or connection.in_atomic_block:
        return [_create_one(row, wait) for row in rows]

    def in_thread(row: Sandbox) -> SandboxError | None:
        try:
            return _create_one(row, wait)
        finally:
            connection.close()  # this pool thread's own connection

    with ThreadPoolExecutor(max_workers=min(len(rows), PROVISION_PARALLELISM)) as pool:
        return list(pool.map(in_thread, rows))


def _create_one(sandbox: Sandbox, wait: bool) -> SandboxError | None:
    try:
        fleet_ops.sandbox_create(sandbox=sandbox, wait=wait)
        return None
    except SandboxError as error:
        log.warning("fleet %s: create of %s failed: %s", sandbox.fleet.name, sandbox.name, error)
        return error


def _failing_in_a_row(fleet: Fleet) -> bool:
    """The fleet's last few creates all failed: more would only churn."""
    recent = list(fleet.sandboxes.order_by("-id").values_list("failure_reason", "ready_at")[:HOLD_AFTER_FAILURES])
    return len(recent) == HOLD_AFTER_FAILURES and all(reason and ready is None for reason, ready in recent)


def _rate_budget(fleet: Fleet) -> int:
    """A sliding one-minute window over creations (cold ones included), kept in the rows themselves."""
    recent = fleet.sandboxes.filter(requested_at__gte=timezone.now() - timedelta(minutes=1)).count()
    return max(0, fleet.refill_per_minute - recent)


def _reap_reason(sandbox: Sandbox, now: datetime) -> str:
    if sandbox.state in (S.FAILED, S.LOST):
        return f"cleanup after {sandbox.state}"
    template = sandbox.template or sandbox.fleet.template
    idle_since = sandbox.last_used_at or sandbox.ready_at
    if sandbox.state == S.LEASED and sandbox.lease_expires_at and sandbox.lease_expires_at < now:
        return f"lease of {sandbox.lease_holder} expired"
    if sandbox.state in (S.WARM, S.LEASED, S.RELEASED) and sandbox.requested_at < now - timedelta(seconds=template.max_lifetime_s):
        return f"over max lifetime ({template.max_lifetime_s} s)"
    if sandbox.state in (S.WARM, S.LEASED) and idle_since and idle_since < now - timedelta(seconds=template.idle_timeout_s):
        return f"idle for more than {template.idle_timeout_s} s"
    if sandbox.state == S.RELEASED and sandbox.released_at and sandbox.released_at < now - timedelta(seconds=RELEASED_GRACE_S):
        return "release did not finish"
    return ""


def _to_retire(fleet: Fleet, warm: list[Sandbox], coming: int, room: int) -> list[Sandbox]:
    """Rolling replacement and trimming. An outdated warm sandbox (another spec) goes once fresh ones cover
    the target without it; if max_total leaves no room to build a replacement, one goes per round to make
    room. Warm sandboxes beyond max_warm go, outdated and oldest first."""
    spec = fleet.template.spec_hash
    outdated = [s for s in warm if s.spec_hash != spec]
    fresh = [s for s in warm if s.spec_hash == spec]
    target = warm_target(fleet)
    surplus = len(fresh) + len(outdated) - target
    count = min(len(outdated), max(0, surplus))
    if count == 0 and outdated and room <= 0 and len(fresh) + coming < target:
        count = 1
    chosen = outdated[:count]
    beyond = len(warm) - len(chosen) - fleet.max_warm
    rest = [s for s in outdated[count:] + fresh]
    return chosen + rest[:max(0, beyond)]


def _retire_reason(fleet: Fleet, sandbox: Sandbox) -> str:
    if sandbox.spec_hash != fleet.template.spec_hash:
        return f"rolling replacement: fleet moved to {fleet.template}"
    return f"above max_warm ({fleet.max_warm})"


# The recording proxy's pods and namespace as deploy/trove.yaml labels them: the only egress a
# proxy-only sandbox pod gets from its fleet's NetworkPolicy.
PROXY_POD_LABELS = {"app.kubernetes.io/name": "trove", "app.kubernetes.io/component": "proxy"}
PROXY_NAMESPACE_LABELS = {"trove.dev/role": "control-plane"}


# --- the watch --------------------------------------------------------------------------------------------

MANAGED = {"app.kubernetes.io/managed-by": "trove"}


def fleet_watch(*, stop_event: threading.Event, backend_kind: str = "kubernetes",
                enqueue: Enqueue | None = None) -> None:
    """Stream the backend's observations of every Trove sandbox and apply each to its row as it happens (a
    pod that becomes ready is warm within moments, not at the next round). Blocks until `stop_event`.
    Orphans are left to the reconciler (they need a grace period and the full listing)."""
    backend = get_backend(backend_kind)
    watch = getattr(backend, "watch_sandboxes", None)
    if watch is None:
        raise SandboxError(f"the {backend_kind} backend has no watch; its reconciler rounds observe it",
                           reason="no_watch", permanent=True)

    def apply(observation) -> None:
        try:
            handle = None if observation.kind == "deleted" else observation.handle
            watch_apply(name=observation.handle.name, handle=handle, enqueue=enqueue)
        finally:
            connection.close_if_unusable_or_obsolete()

    watch(MANAGED, apply, stop_event)


def watch_apply(*, name: str, handle: SandboxHandle | None, enqueue: Enqueue | None = None) -> str:
    """Apply one watch observation of the object `name` (None: deleted) to its row, if it has a live one."""
    seen_at = timezone.now()
    sandbox = (Sandbox.objects.select_related("fleet__template", "template")
               .exclude(state=S.TERMINATED).filter(name=name).first())
    if sandbox is None:
        return ""
    return sandbox_observe(sandbox=sandbox, handle=handle, seen_at=seen_at, enqueue=enqueue)
