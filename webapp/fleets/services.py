"""Fleet state in the database: templates, fleet sizing and holds, sandbox transitions, leases with fencing
tokens, the event log.

These functions never talk to a backend (that is `workers.fleet_ops`, which calls them); each sandbox
transition is one conditional UPDATE (`... WHERE state IN (...)`) or a row lock, so two processes can
never both move the same sandbox, and every transition that happens writes one SandboxEvent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Field, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from experience.errors import ValidationError
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

S = Sandbox.State
H = Fleet.HoldKind

# Which timestamp a state sets when entered.
_PHASE_FIELD: dict[str, str] = {
    S.PROVISIONING: "scheduled_at",
    S.WARM: "ready_at",
    S.LEASED: "leased_at",
    S.RELEASED: "released_at",
    S.TERMINATED: "terminated_at",
}
SIZE_FIELDS = ("min_warm", "max_warm", "max_total", "refill_per_minute")
FLEET_FIELDS = (*SIZE_FIELDS, "backend", "sizing", "miss_policy", "miss_wait_ms", "provision_timeout_s")


# --- events ----------------------------------------------------------------------------------------------

def event_record(*, kind: str, sandbox: Sandbox | None = None, fleet_id: int | None = None, sandbox_name: str = "",
                 reason: str = "", from_state: str = "", to_state: str = "", data: dict | None = None) -> SandboxEvent:
    """Append one event. A fleet-level event (a hold, an orphan with no row) passes `fleet_id` instead."""
    owner = sandbox.fleet_id if sandbox else fleet_id
    if owner is None:
        raise ValueError("an event needs a sandbox or a fleet_id")
    return SandboxEvent.objects.create(
        sandbox=sandbox, fleet_id=owner,
        sandbox_name=sandbox.name if sandbox else sandbox_name, kind=kind, from_state=from_state,
        to_state=to_state, reason=reason[:4000], data=data or {},
    )


def event_record_relaxed(*, sandbox: Sandbox, kind: str, reason: str = "", data: dict | None = None) -> None:
    """Append an observational event (see relaxed_commit). On Postgres outside a transaction it is one
    statement in its own relaxed commit: one round trip instead of four (BEGIN, SET LOCAL, INSERT, COMMIT)."""
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(_RELAXED_EVENT_SQL, {"sandbox": sandbox.pk, "name": sandbox.name, "fleet": sandbox.fleet_id,
                                                "kind": kind, "reason": reason[:4000],
                                                "data": json.dumps(data or {}), "now": timezone.now()})
        return
    with relaxed_commit():
        event_record(sandbox=sandbox, kind=kind, reason=reason, data=data)


# A statement that commits without waiting for the WAL flush, in one round trip (what relaxed_commit does in
# four): set_config(..., is_local => true) lasts for the statement's own (autocommit) transaction, and the
# `relaxed` row is joined into the statement so that it is evaluated.
RELAXED_CTE = "relaxed AS (SELECT set_config('synchronous_commit', 'off', true))"
# A sandbox event (no state change) whose statement joins `relaxed`.
_EVENT_FROM_RELAXED = """
INSERT INTO fleets_sandboxevent
    (sandbox_id, sandbox_name, fleet_id, kind, from_state, to_state, reason, data, created_at)
SELECT %(sandbox)s, %(name)s, %(fleet)s, %(kind)s, '', '', %(reason)s, %(data)s::jsonb, %(now)s
FROM relaxed
"""
_RELAXED_EVENT_SQL = f"WITH {RELAXED_CTE}{_EVENT_FROM_RELAXED}"


# --- templates -------------------------------------------------------------------------------------------

def template_create(*, name: str, **fields: Any) -> EnvironmentTemplate:
    """Templates are immutable: creating one with an existing name makes the next version."""
    _check_template(name, fields)
    with transaction.atomic():
        latest = EnvironmentTemplate.objects.select_for_update().filter(name=name).order_by("-version").first()
        version = latest.version + 1 if latest else 1
        return EnvironmentTemplate.objects.create(name=name, version=version, **fields)


def template_revise(*, template: EnvironmentTemplate, **changes: Any) -> EnvironmentTemplate:
    """"Edit" a template: a new version of the same name with `changes` applied to the newest version's spec."""
    latest = EnvironmentTemplate.objects.filter(name=template.name).order_by("-version").first() or template
    fields = {field: getattr(latest, field) for field in EnvironmentTemplate.SPEC_FIELDS}
    return template_create(name=template.name, **{**fields, **changes})


def _check_template(name: str, fields: dict[str, Any]) -> None:
    if not name or len(name) > 100:
        raise ValidationError("name: required, at most 100 characters", field="name")
    unknown = set(fields) - set(EnvironmentTemplate.SPEC_FIELDS)
    if unknown:
        raise ValidationError(f"{sorted(unknown)[0]}: not a template field", field=sorted(unknown)[0])
    if fields.get("network", "none") not in EnvironmentTemplate.Network.values:
        raise ValidationError(f"network: one of {', '.join(EnvironmentTemplate.Network.values)}", field="network")
    if fields.get("eval_mode", "in-place") not in EnvironmentTemplate.EvalMode.values:
        raise ValidationError(f"eval_mode: one of {', '.join(EnvironmentTemplate.EvalMode.values)}",
                              field="eval_mode")
    for key in ("cpu", "memory_mb", "pids"):
        if key in fields and not fields[key] > 0:
            raise ValidationError(f"{key}: must be positive", field=key)
    for key in ("setup_commands", "allow_list"):
        value = fields.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValidationError(f"{key}: a list of strings", field=key)


# --- fleets ----------------------------------------------------------------------------------------------

def fleet_create(*, name: str, template: EnvironmentTemplate, **fields: Any) -> Fleet:
    unknown = set(fields) - set(FLEET_FIELDS)
    if unknown:
        raise ValidationError(f"{sorted(unknown)[0]}: not a fleet field", field=sorted(unknown)[0])
    if not name or len(name) > 100:
        raise ValidationError("name: required, at most 100 characters", field="name")
    if Fleet.objects.filter(name=name).exists():
        raise ValidationError(f"name: a fleet named {name!r} exists", field="name")
    fleet = Fleet(name=name, template=template, **fields)
    _check_choices(fleet)
    _check_sizes(fleet)
    fleet.save()
    return fleet


def _check_choices(fleet: Fleet) -> None:
    for key, choices in (("backend", Fleet.Backend), ("sizing", Fleet.Sizing), ("miss_policy", Fleet.MissPolicy)):
        if getattr(fleet, key) not in choices.values:
            raise ValidationError(f"{key}: one of {', '.join(choices.values)}", field=key)


def _check_sizes(fleet: Fleet) -> None:
    if fleet.min_warm > fleet.max_warm:
        raise ValidationError("min_warm: must not exceed max_warm", field="min_warm")
    if fleet.max_warm > fleet.max_total:
        raise ValidationError("max_warm: must not exceed max_total", field="max_warm")
    if fleet.refill_per_minute < 1:
        raise ValidationError("refill_per_minute: at least 1", field="refill_per_minute")


def fleet_scale(*, fleet: Fleet, reason: str = "scaled", **sizes: int | None) -> Fleet:
    """Set any of min_warm / max_warm / max_total / refill_per_minute. Scaling is an operator saying "serve
    with these numbers": a draining fleet becomes active again and a hold is lifted (the next round retries)."""
    unknown = set(sizes) - set(SIZE_FIELDS)
    if unknown:
        raise ValidationError(f"{sorted(unknown)[0]}: not a size", field=sorted(unknown)[0])
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        for key, value in sizes.items():
            if value is not None:
                setattr(fleet, key, value)
        _check_sizes(fleet)
        _clear_hold(fleet)
        fleet.status = Fleet.Status.ACTIVE
        fleet.save(update_fields=[*SIZE_FIELDS, "status", "hold_kind", "hold_reason", "held_at", "hold_until"])
        event_record(kind="scaled", fleet_id=fleet.pk, reason=reason,
                     data={key: getattr(fleet, key) for key in SIZE_FIELDS})
    return fleet


def fleet_drain(*, fleet: Fleet, reason: str = "drained by an operator") -> Fleet:
    """Stop keeping sandboxes warm and creating new ones; leased sandboxes finish their work. The reconciler
    retires the warm ones. Undo with fleet_scale."""
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        _clear_hold(fleet)
        fleet.status = Fleet.Status.DRAINING
        fleet.save(update_fields=["status", "hold_kind", "hold_reason", "held_at", "hold_until"])
        event_record(kind="drain", fleet_id=fleet.pk, reason=reason)
    return fleet


def fleet_set_template(*, fleet: Fleet, template: EnvironmentTemplate, reason: str = "") -> Fleet:
    """Move the fleet to another template version. New sandboxes use it at once; the reconciler replaces the
    warm ones built from a different spec in a rolling way (see reconciler). Lifts a hold: a new spec is
    the operator's answer to a permanent error."""
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
        previous = fleet.template
        fleet.template = template
        _clear_hold(fleet)
        if fleet.status == Fleet.Status.HOLDING:
            fleet.status = Fleet.Status.ACTIVE
        fleet.save(update_fields=["template", "status", "hold_kind", "hold_reason", "held_at", "hold_until"])
        event_record(kind="template", fleet_id=fleet.pk, reason=reason or f"{previous} -> {template}",
                     data={"from": previous.pk, "to": template.pk, "spec_hash": template.spec_hash})
    return fleet


def fleet_hold(*, fleet: Fleet, kind: str, reason: str, retry_in_s: float | None) -> None:
    """Stop creating, with a visible reason. `retry_in_s=None` holds until an operator acts. The event is
    written only when the hold is new or its reason changed, so a long hold does not flood the log."""
    now = timezone.now()
    until = now + timedelta(seconds=retry_in_s) if retry_in_s is not None else None
    changed = (fleet.status, fleet.hold_kind, fleet.hold_reason) != (Fleet.Status.HOLDING, kind, reason)
    fleet.status, fleet.hold_kind, fleet.hold_reason = Fleet.Status.HOLDING, kind, reason[:2000]
    fleet.held_at, fleet.hold_until = fleet.held_at or now, until
    # Conditional on not draining: an operator's drain wins over a reconciler's hold.
    Fleet.objects.filter(pk=fleet.pk).exclude(status=Fleet.Status.DRAINING).update(
        status=fleet.status, hold_kind=kind, hold_reason=fleet.hold_reason, held_at=fleet.held_at, hold_until=until)
    if changed:
        event_record(kind="hold", fleet_id=fleet.pk, reason=reason, data={"hold_kind": kind, "retry_in_s": retry_in_s})


def fleet_unhold(*, fleet: Fleet, reason: str) -> None:
    if fleet.status != Fleet.Status.HOLDING:
        return
    _clear_hold(fleet)
    fleet.status = Fleet.Status.ACTIVE
    Fleet.objects.filter(pk=fleet.pk, status=Fleet.Status.HOLDING).update(
        status=fleet.status, hold_kind="", hold_reason="", held_at=None, hold_until=None)
    event_record(kind="unhold", fleet_id=fleet.pk, reason=reason)


def _clear_hold(fleet: Fleet) -> None:
    fleet.hold_kind, fleet.hold_reason, fleet.held_at, fleet.hold_until = H.NONE, "", None, None


def fleet_count_claim(*, fleet_id: int, hit: bool) -> None:
    """Outside the claim's transaction, so the fleet row is never held while claiming; a relaxed commit."""
    with relaxed_commit():
        if hit:
            Fleet.objects.filter(pk=fleet_id).update(claims_hit=F("claims_hit") + 1)
        else:
            Fleet.objects.filter(pk=fleet_id).update(claims_miss=F("claims_miss") + 1)


@contextmanager
def relaxed_commit() -> Iterator[None]:
    """A transaction for observational writes on the hot path (claim counters, the exec log, usage stamps):
    on Postgres it commits asynchronously, skipping the WAL flush (a few ms on a busy disk, against ~0.1 ms).
    A crash of the database server may lose the last fraction of a second of such writes; nothing that
    guards correctness (a lease, a fencing token, a state) is ever written this way. Inside a caller's
    transaction it changes nothing: the caller's commit decides."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


# --- sandboxes -------------------------------------------------------------------------------------------

def sandboxes_request(*, fleet: Fleet, n: int, creator_waits: bool = False, cold: bool = False) -> list[Sandbox]:
    """Up to `n` new rows in `requested`, never past max_total: counted and inserted under the fleet's row
    lock, so a reconciler topping up and workers creating cold cannot together overshoot. Committed before
    any backend call. Each name is derived from the row's id, so every retry of its create asks the backend
    for the same name and can never make a second sandbox."""
    with transaction.atomic():
        locked = Fleet.objects.select_for_update(of=("self",)).select_related("template").get(pk=fleet.pk)
        occupying = Sandbox.objects.filter(fleet_id=fleet.pk, state__in=Sandbox.OCCUPYING_STATES).count()
        rows = [_request_one(locked, creator_waits=creator_waits, cold=cold)
                for _ in range(max(0, min(n, locked.max_total - occupying)))]
    for sandbox in rows:
        sandbox.fleet = fleet
    return rows


def _request_one(fleet: Fleet, *, creator_waits: bool, cold: bool) -> Sandbox:
    template = fleet.template
    sandbox = Sandbox.objects.create(fleet=fleet, template=template, spec_hash=template.spec_hash,
                                     name=f"pending-{time.time_ns()}", creator_waits=creator_waits, cold_claim=cold)
    sandbox.name = f"trove-{fleet.pk}-{sandbox.pk}"
    sandbox.save(update_fields=["name"])
    event_record(sandbox=sandbox, kind="transition", to_state=S.REQUESTED,
                 reason="requested for a cold claim" if cold else "requested")
    return sandbox


def sandbox_transition(*, sandbox: Sandbox, to: str, expect: tuple[str, ...], reason: str = "",
                       where: dict[str, Any] | None = None, data: dict | None = None, **fields: Any) -> bool:
    """Move `sandbox` to `to` only if it is in one of `expect` (and matches `where`). Returns False, changing
    nothing, otherwise. Updates the instance in place and logs the transition.

    The UPDATE and its event commit together: the row stays locked until its event is written, so nobody
    (a claim, say) can act on the new state before the log shows it, and the log's order is the truth's. On
    Postgres both are one statement (`_TRANSITION_SQL`), so outside a transaction a transition is one round
    trip instead of four (BEGIN, UPDATE, INSERT, COMMIT)."""
    now = timezone.now()
    updates = dict(fields, state=to)
    if to in _PHASE_FIELD:
        updates[_PHASE_FIELD[to]] = now
    plain = not any(hasattr(value, "resolve_expression") for value in updates.values())  # no F() and such
    if connection.vendor == "postgresql" and plain:
        from_state = _transition_statement(sandbox, to, expect, where or {}, updates, reason, data, now)
        if from_state is None:
            return False
        for key, value in updates.items():
            setattr(sandbox, key, value)
        return True
    with transaction.atomic():
        changed = Sandbox.objects.filter(pk=sandbox.pk, state__in=expect, **(where or {})).update(**updates)
        if not changed:
            return False
        from_state = sandbox.state if sandbox.state in expect else ""
        event_record(sandbox=sandbox, kind="transition", from_state=from_state, to_state=to, reason=reason,
                     data=data)
    for key, value in updates.items():
        setattr(sandbox, key, value)
    return True


# One statement, one round trip (autocommit): lock the row if it is in an expected state (`{old}`, the ORM's
# SELECT with FOR NO KEY UPDATE), move it, log the move with the state it really came from. A row another
# process moved first fails the re-check Postgres makes once the lock is granted.
_TRANSITION_SQL = """
WITH old AS ({old} FOR NO KEY UPDATE), moved AS (
    UPDATE fleets_sandbox AS s SET {assignments}
    FROM old WHERE s.id = old.id
    RETURNING s.id, old.state AS from_state, s.name, s.fleet_id
), logged AS (
    INSERT INTO fleets_sandboxevent
        (sandbox_id, sandbox_name, fleet_id, kind, from_state, to_state, reason, data, created_at)
    SELECT id, name, fleet_id, 'transition', from_state, %s, %s, %s::jsonb, %s
    FROM moved
)
SELECT from_state FROM moved
"""


def _transition_statement(sandbox: Sandbox, to: str, expect: tuple[str, ...], where: dict[str, Any],
                          updates: dict[str, Any], reason: str, data: dict | None, now: datetime) -> str | None:
    """sandbox_transition on Postgres: the from-state, or None if the row was not in `expect`."""
    old = Sandbox.objects.filter(pk=sandbox.pk, state__in=expect, **where).values_list("id", "state")
    old_sql, old_params = old.query.sql_with_params()
    assignments, set_params = [], []
    for name, value in updates.items():
        field = Sandbox._meta.get_field(name)
        assert isinstance(field, Field), f"{name} is not a column of Sandbox"
        assignments.append(f"{connection.ops.quote_name(str(field.column))} = %s")
        set_params.append(field.get_db_prep_save(value, connection))
    sql = _TRANSITION_SQL.format(old=old_sql, assignments=", ".join(assignments))
    params = [*old_params, *set_params, to, reason[:4000], json.dumps(data or {}), now]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return row[0] if row else None


def _claim_ms(started: float | None) -> float | None:
    """Milliseconds since `started` (perf_counter), for the claim event; None when not timed."""
    return round((time.perf_counter() - started) * 1000, 3) if started is not None else None


def sandbox_claim_warm(*, fleet: Fleet, holder: str, lease_seconds: int, started: float | None = None,
                       claim: str = "warm", count_hit: bool = False, count_miss: bool = False) -> Sandbox | None:
    """Lease a warm sandbox, atomically, never waiting on a backend; with `count_hit` (`count_miss`), count a
    warm hit (a miss) on the fleet in the same step. None on a miss. The fleet is not re-read: the caller's
    instance names it.

    SKIP LOCKED lets concurrent claimers take different rows instead of queueing behind one. NO KEY UPDATE,
    because a plain FOR UPDATE conflicts with the KEY SHARE lock every event INSERT takes on its sandbox
    (the foreign key check): a claim would skip a warm sandbox whose "warm" event was still committing and
    miss with it in plain sight. On Postgres the
    whole claim (pick, lease, event, counter) is one statement: one round trip and one commit, which is most
    of a warm claim's cost. Elsewhere (the embedded SQLite default) it is the same steps in a transaction.
    """
    claim_ms = _claim_ms(started)
    if connection.vendor == "postgresql":
        sandbox = _claim_warm_statement(fleet, holder, lease_seconds, claim, claim_ms, count_hit, count_miss)
    else:
        sandbox = _claim_warm_orm(fleet, holder, lease_seconds, claim, claim_ms, count_hit)
        if sandbox is None and count_miss:
            fleet_count_claim(fleet_id=fleet.pk, hit=False)
    if sandbox is not None:
        sandbox.fleet = fleet
    return sandbox


# The row lock on the fleet (for the counter) is taken last and held only until this statement's commit;
# lock order everywhere else is fleet row first with no sandbox row held, so no cycle is possible.
_CLAIM_SQL = """
WITH picked AS (
    SELECT id FROM fleets_sandbox
    WHERE fleet_id = %(fleet)s AND state = 'warm'
    ORDER BY ready_at, id
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
), leased AS (
    UPDATE fleets_sandbox AS s
    SET state = 'leased', lease_holder = %(holder)s, lease_expires_at = %(expires)s,
        fencing_token = s.fencing_token + 1, leased_at = %(now)s, last_used_at = %(now)s, first_exec_at = NULL
    FROM picked WHERE s.id = picked.id
    RETURNING s.*
), logged AS (
    INSERT INTO fleets_sandboxevent
        (sandbox_id, sandbox_name, fleet_id, kind, from_state, to_state, reason, data, created_at)
    SELECT id, name, fleet_id, 'transition', 'warm', 'leased', %(reason)s,
           jsonb_build_object('holder', %(holder)s::text, 'fencing_token', fencing_token,
                              'claim', %(claim)s::text, 'claim_ms', %(claim_ms)s::float8),
           %(now)s
    FROM leased
), counted AS (
    UPDATE fleets_fleet
    SET claims_hit = claims_hit + CASE WHEN EXISTS (SELECT 1 FROM leased) THEN 1 ELSE 0 END,
        claims_miss = claims_miss + CASE WHEN EXISTS (SELECT 1 FROM leased) THEN 0 ELSE 1 END
    WHERE id = %(fleet)s AND CASE WHEN EXISTS (SELECT 1 FROM leased) THEN %(count_hit)s ELSE %(count_miss)s END
), relaxed AS (
    -- A miss writes nothing but its counter, an observation: its commit need not wait for the WAL flush.
    SELECT set_config('synchronous_commit', 'off', true) WHERE NOT EXISTS (SELECT 1 FROM leased)
)
SELECT * FROM leased WHERE (SELECT count(*) FROM relaxed) >= 0
"""


def _claim_warm_statement(fleet: Fleet, holder: str, lease_seconds: int, claim: str, claim_ms: float | None,
                          count_hit: bool, count_miss: bool) -> Sandbox | None:
    now = timezone.now()
    params = {"fleet": fleet.pk, "holder": holder[:200], "expires": now + timedelta(seconds=lease_seconds),
              "now": now, "reason": f"{claim} claim", "claim": claim, "claim_ms": claim_ms, "count_hit": count_hit,
              "count_miss": count_miss}
    return next(iter(Sandbox.objects.raw(_CLAIM_SQL, params)), None)


def _claim_warm_orm(fleet: Fleet, holder: str, lease_seconds: int, claim: str, claim_ms: float | None,
                    count_hit: bool) -> Sandbox | None:
    with transaction.atomic():
        sandbox = (
            Sandbox.objects.select_for_update(skip_locked=True, no_key=True)
            .filter(fleet_id=fleet.pk, state=S.WARM)
            .order_by("ready_at", "id")
            .first()
        )
        if sandbox is None:
            return None
        _lease(sandbox, holder=holder, lease_seconds=lease_seconds, claim=claim, claim_ms=claim_ms)
    if count_hit:
        fleet_count_claim(fleet_id=fleet.pk, hit=True)
    return sandbox


def sandbox_lease_cold(*, sandbox: Sandbox, holder: str, lease_seconds: int, started: float | None = None) -> bool:
    """Lease a sandbox this caller provisioned itself after a miss: provisioning -> leased directly, so it is
    never warm (and claimable by anyone else) in between. False if it is no longer provisioning. On Postgres
    the lease and its event are one statement, like a warm claim."""
    if connection.vendor == "postgresql":
        return _lease_cold_statement(sandbox, holder, lease_seconds, started)
    with transaction.atomic():
        locked = Sandbox.objects.select_for_update().filter(pk=sandbox.pk, state=S.PROVISIONING).first()
        if locked is None:
            return False
        locked.endpoint, locked.agent_secret = sandbox.endpoint, sandbox.agent_secret
        locked.ready_at = timezone.now()
        claim_ms = _claim_ms(started)
        _lease(locked, holder=holder, lease_seconds=lease_seconds, claim="cold", claim_ms=claim_ms,
               extra_fields=("endpoint", "agent_secret", "ready_at"))
    for key in ("state", "lease_holder", "lease_expires_at", "fencing_token", "leased_at", "ready_at",
                "last_used_at", "first_exec_at"):
        setattr(sandbox, key, getattr(locked, key))
    return True


_LEASE_COLD_SQL = """
WITH leased AS (
    UPDATE fleets_sandbox AS s
    SET state = 'leased', lease_holder = %(holder)s, lease_expires_at = %(expires)s,
        fencing_token = s.fencing_token + 1, leased_at = %(now)s, last_used_at = %(now)s, first_exec_at = NULL,
        ready_at = %(now)s, endpoint = %(endpoint)s, agent_secret = %(secret)s
    WHERE s.id = %(sandbox)s AND s.state = 'provisioning'
    RETURNING s.*
), logged AS (
    INSERT INTO fleets_sandboxevent
        (sandbox_id, sandbox_name, fleet_id, kind, from_state, to_state, reason, data, created_at)
    SELECT id, name, fleet_id, 'transition', 'provisioning', 'leased', 'cold claim',
           jsonb_build_object('holder', %(holder)s::text, 'fencing_token', fencing_token,
                              'claim', 'cold', 'claim_ms', %(claim_ms)s::float8),
           %(now)s
    FROM leased
)
SELECT fencing_token FROM leased
"""


def _lease_cold_statement(sandbox: Sandbox, holder: str, lease_seconds: int, started: float | None) -> bool:
    now = timezone.now()
    claim_ms = _claim_ms(started)
    with connection.cursor() as cursor:
        cursor.execute(_LEASE_COLD_SQL, {"sandbox": sandbox.pk, "holder": holder[:200], "now": now,
                                         "expires": now + timedelta(seconds=lease_seconds), "claim_ms": claim_ms,
                                         "endpoint": sandbox.endpoint, "secret": sandbox.agent_secret})
        row = cursor.fetchone()
    if row is None:
        return False
    sandbox.state, sandbox.lease_holder, sandbox.fencing_token = S.LEASED, holder[:200], row[0]
    sandbox.lease_expires_at = now + timedelta(seconds=lease_seconds)
    sandbox.leased_at = sandbox.last_used_at = sandbox.ready_at = now
    sandbox.first_exec_at = None
    return True


def _lease(sandbox: Sandbox, *, holder: str, lease_seconds: int, claim: str, claim_ms: float | None,
           extra_fields: tuple[str, ...] = ()) -> None:
    """Caller holds the row lock. `claim_ms` in the event covers the claim call up to this write."""
    now = timezone.now()
    from_state = sandbox.state
    sandbox.state = S.LEASED
    sandbox.lease_holder = holder[:200]
    sandbox.lease_expires_at = now + timedelta(seconds=lease_seconds)
    sandbox.fencing_token = sandbox.fencing_token + 1
    sandbox.leased_at = sandbox.last_used_at = now
    sandbox.first_exec_at = None  # time to first exec is per lease (a reusable sandbox is leased again)
    sandbox.save(update_fields=["state", "lease_holder", "lease_expires_at", "fencing_token", "leased_at",
                                "last_used_at", "first_exec_at", *extra_fields])
    data: dict[str, Any] = {"holder": holder, "fencing_token": sandbox.fencing_token, "claim": claim,
                            "claim_ms": claim_ms}
    event_record(sandbox=sandbox, kind="transition", from_state=from_state, to_state=S.LEASED,
                 reason=f"{claim} claim", data=data)


def sandbox_fence(*, sandbox_id: int, fencing_token: int) -> None:
    """One query, a read: pass if the caller's lease is still the current one, else log the refusal and
    raise StaleFencingToken."""
    if Sandbox.objects.filter(pk=sandbox_id, state=S.LEASED, fencing_token=fencing_token).exists():
        return
    sandbox = Sandbox.objects.get(pk=sandbox_id)
    message = (f"sandbox {sandbox.name}: fencing token {fencing_token} is stale "
               f"(current {sandbox.fencing_token}, state {sandbox.state})")
    event_record(sandbox=sandbox, kind="fence_refused", reason=message,
                 data={"fencing_token": fencing_token, "current": sandbox.fencing_token})
    raise StaleFencingToken(message)


def sandbox_check_fence(*, sandbox_id: int, fencing_token: int) -> None:
    """Old name of sandbox_fence, kept for callers."""
    sandbox_fence(sandbox_id=sandbox_id, fencing_token=fencing_token)


def sandbox_heartbeat(*, sandbox_id: int, fencing_token: int, lease_seconds: int) -> bool:
    """Extend the lease; False if the lease is no longer the caller's."""
    now = timezone.now()
    return bool(
        Sandbox.objects.filter(pk=sandbox_id, state=S.LEASED, fencing_token=fencing_token).update(
            lease_expires_at=now + timedelta(seconds=lease_seconds), last_used_at=now
        )
    )


def sandbox_exec_recorded(*, sandbox: Sandbox, command: str, exit_code: int | None, duration_ms: float,
                          reason: str = "", timed_out: bool = False, fencing_token: int | None = None,
                          error: str = "", started_at: datetime | None = None, first: bool = False) -> None:
    """Log an exec (or one the agent could not run: `error`) and touch the sandbox's last use; the first exec
    of a lease (`first`) stamps `first_exec_at` with `started_at`, when the command was sent. The log is
    observational, so it is written with a relaxed commit (see relaxed_commit): on Postgres, outside a
    caller's transaction, as one statement that turns the commit's WAL flush off for itself."""
    now = timezone.now()
    data: dict[str, Any] = {"command": command[:500], "exit_code": exit_code, "duration_ms": round(duration_ms, 2),
                            "timed_out": timed_out}
    if fencing_token is not None:
        data["fencing_token"] = fencing_token
    if error:
        data["error"] = error[:1000]
    kind = "exec_failed" if error else "exec"
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(_EXEC_SQL, {"sandbox": sandbox.pk, "name": sandbox.name, "fleet": sandbox.fleet_id,
                                       "now": now, "first": first, "sent": started_at or now, "kind": kind,
                                       "reason": reason[:4000], "data": json.dumps(data)})
        return
    touch: dict[str, Any] = {"last_used_at": now}
    if first:
        touch["first_exec_at"] = Coalesce("first_exec_at", Value(started_at or now))
    with relaxed_commit():
        Sandbox.objects.filter(pk=sandbox.pk).update(**touch)
        event_record(sandbox=sandbox, kind=kind, reason=reason, data=data)


# An exec's log: the sandbox touched and the event written, committed relaxed (RELAXED_CTE).
_EXEC_SQL = f"""
WITH {RELAXED_CTE}, touched AS (
    UPDATE fleets_sandbox
    SET last_used_at = %(now)s,
        first_exec_at = CASE WHEN %(first)s THEN COALESCE(first_exec_at, %(sent)s) ELSE first_exec_at END
    WHERE id = %(sandbox)s
){_EVENT_FROM_RELAXED}"""
