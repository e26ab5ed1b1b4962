"""Fleet operations that need a backend: create, adopt, claim (warm or cold), exec with fencing, release,
terminate.

The database side of every transition is in `webapp.fleets.services`; this module sequences backend calls
around it. A backend call never happens inside a database transaction (they can take seconds).

The claim path is the hot one (a rollout waits on it). On Postgres, outside a transaction, each step is as
few round trips as its guarantees allow: a warm claim (or a counted miss) is one statement and never touches
the backend; an exec is the fence check, run while the agent's connection is being set up and before
anything is sent, and one statement logging it after (not deferred to a later statement: the log of an exec
must survive its worker being killed right after); every transition is one statement with its event; a
single-use release is four (released, the reuse facts, terminating, terminated after the destroy).
`tests/workers/test_fleet_round_trips.py` holds the budgets.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from webapp.fleets import services as fleet_services
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox
from workers.sandboxes.base import ExecResult, SandboxError, SandboxHandle, SandboxSpec, SandboxStartFailed
from workers.sandboxes.registry import destroy_is_final, get_backend

log = logging.getLogger("trove.fleets")
S = Sandbox.State
DEFAULT_LEASE_S = 300
WAIT_POLL_S = 0.05
SETUP_TIMEOUT_S = 300.0
LABEL_FLEET = "trove.dev/fleet"
LABEL_SANDBOX = "trove.dev/sandbox"
TERMINABLE = (*Sandbox.LIVE_STATES, S.FAILED, S.LOST)


def fleet_labels(fleet_id: int) -> dict[str, str]:
    return {LABEL_FLEET: str(fleet_id)}


def spec_for(sandbox: Sandbox) -> SandboxSpec:
    """The spec of the template version the row was requested under (the fleet may have moved on since)."""
    template = _template_of(sandbox)
    return SandboxSpec(
        name=sandbox.name,
        labels={**fleet_labels(sandbox.fleet_id), LABEL_SANDBOX: sandbox.name},
        image=template.image,
        rootfs=template.rootfs,
        cpu=template.cpu,
        memory_mb=template.memory_mb,
        pids=template.pids,
        disk_mb=template.disk_mb,
        network=template.network,
        # A local proxy-only sandbox reaches the recording proxy through its Unix socket and nothing else.
        proxy_socket=settings.TROVE_PROXY_SOCKET if template.network == "proxy-only" else "",
    )


def _template_of(sandbox: Sandbox) -> EnvironmentTemplate:
    """The row's own template version; rows made before versions were recorded use the fleet's."""
    own = sandbox.template if sandbox.template_id else None
    return own or sandbox.fleet.template


# --- creating ----------------------------------------------------------------------------------------------

def sandbox_provision(*, fleet: Fleet, wait: bool = True, timeout: float | None = None) -> Sandbox:
    """One new sandbox for the warm pool: warm on return with `wait`, else left `provisioning` for an observer
    (the reconciler or `fleet_watch`) to adopt. Raises SandboxError (the row is failed and cleaned up), or
    `fleet_full` when the fleet is at max_total."""
    rows = fleet_services.sandboxes_request(fleet=fleet, n=1, creator_waits=wait)
    if not rows:
        raise SandboxError(f"fleet {fleet.name} is at max_total ({fleet.max_total})", reason="fleet_full")
    return sandbox_create(sandbox=rows[0], wait=wait, timeout=timeout)


def sandbox_create(*, sandbox: Sandbox, wait: bool, timeout: float | None = None, cold: bool = False) -> Sandbox:
    """requested -> provisioning -> (with `wait`) ready, set up -> warm. A cold sandbox stays `provisioning`
    with its endpoint filled in, for the caller to lease directly. Retrying with the same row cannot make a
    second sandbox: the backend name is the row's."""
    if not fleet_services.sandbox_transition(sandbox=sandbox, to=S.PROVISIONING, expect=(S.REQUESTED,),
                                             reason="create sent to the backend"):
        sandbox.refresh_from_db(fields=["state"])
        if sandbox.state != S.PROVISIONING:  # else: a retry of a create already sent, which is safe
            raise SandboxError(f"sandbox {sandbox.name} is {sandbox.state}, not to be created", reason="moved")
    backend = get_backend(sandbox.fleet.backend)
    try:
        handle = backend.create(spec_for(sandbox), wait=wait, timeout=timeout or sandbox.fleet.provision_timeout_s)
        if wait:
            sandbox_setup(sandbox=sandbox, handle=handle)
    except SandboxError as error:
        sandbox_fail(sandbox=sandbox, error=error, expect=(S.PROVISIONING,))
        raise
    if not wait:
        return sandbox
    if cold:
        sandbox.endpoint, sandbox.agent_secret = handle.endpoint, handle.secret
    else:
        sandbox_mark_warm(sandbox=sandbox, handle=handle, reason="agent ready")
    return sandbox


def sandbox_setup(*, sandbox: Sandbox, handle: SandboxHandle) -> None:
    """Run the template's setup commands once, before the sandbox is handed out. A failing command is a
    permanent error: the same template would fail the same way."""
    commands = _template_of(sandbox).setup_commands
    backend = get_backend(sandbox.fleet.backend) if commands else None
    for command in commands:
        result = backend.exec(handle, command, timeout=SETUP_TIMEOUT_S)  # type: ignore[union-attr]
        fleet_services.sandbox_exec_recorded(sandbox=sandbox, command=command, exit_code=result.exit_code,
                                             duration_ms=result.duration_ms, reason="template setup",
                                             timed_out=result.timed_out)
        if not result.ok:
            raise SandboxStartFailed(f"setup command failed (exit {result.exit_code}): {command}: "
                                     f"{result.stderr[-300:]}", reason="setup_failed", permanent=True)


def sandbox_mark_warm(*, sandbox: Sandbox, handle: SandboxHandle, reason: str) -> bool:
    return fleet_services.sandbox_transition(
        sandbox=sandbox, to=S.WARM, expect=(S.REQUESTED, S.PROVISIONING), reason=reason,
        endpoint=handle.endpoint, agent_secret=handle.secret, backend_reason="", creator_waits=False,
    )


def sandbox_adopt(*, sandbox: Sandbox, handle: SandboxHandle) -> bool:
    """An observer saw the backend report a provisioning row's object ready: set it up and make it warm.
    Only one observer adopts a row (a conditional UPDATE takes it), so setup never runs twice. The
    observation may carry no secret (a watch does not read secrets): then it is read with get()."""
    if not Sandbox.objects.filter(pk=sandbox.pk, state=S.PROVISIONING, creator_waits=False).update(creator_waits=True):
        return False
    try:
        if not handle.secret or not handle.endpoint:
            handle = get_backend(sandbox.fleet.backend).get(sandbox.name)
        sandbox_setup(sandbox=sandbox, handle=handle)
    except SandboxError as error:
        sandbox_fail(sandbox=sandbox, error=error, expect=(S.PROVISIONING,))
        return False
    return sandbox_mark_warm(sandbox=sandbox, handle=handle, reason="backend reports it ready")


def sandbox_fail(*, sandbox: Sandbox, error: SandboxError | str, expect: tuple[str, ...],
                 permanent: bool = False, to: str = S.FAILED) -> bool:
    """Mark the row failed (or lost) with the reason, then clean the backend up. True if this call moved it."""
    if isinstance(error, SandboxError):
        message, reason, permanent = f"{error.reason}: {error}", error.reason, error.permanent
    else:
        message, reason = error, ""
    moved = fleet_services.sandbox_transition(
        sandbox=sandbox, to=to, expect=expect, reason=message, failure_reason=message[:2000],
        lease_holder="", lease_expires_at=None, data={"reason": reason, "permanent": permanent},
    )
    if moved:
        _terminate_quietly(sandbox, f"cleanup after {to}")
    return moved


# --- claiming --------------------------------------------------------------------------------------------

@dataclass
class Lease:
    """What a rollout holds while it uses a sandbox. Every exec is checked against `fencing_token`."""

    sandbox: Sandbox
    fencing_token: int
    holder: str
    claim_ms: float = 0.0
    executed: bool = False  # an exec already ran under this lease (the first one stamps first_exec_at)

    @property
    def handle(self) -> SandboxHandle:
        return SandboxHandle(name=self.sandbox.name, state="ready", endpoint=self.sandbox.endpoint,
                             secret=self.sandbox.agent_secret)


def sandbox_claim(*, fleet: Fleet, holder: str, lease_seconds: int = DEFAULT_LEASE_S,
                  wait_s: float | None = None) -> Lease:
    """A warm sandbox if one is there; otherwise (a miss, counted) by fleet policy wait up to `wait_s`
    (default: the fleet's miss_wait_ms) for a refill, then create one cold. Raises SandboxError when no cold
    create is allowed (`fleet_full`, `fleet_draining`: transient; `fleet_holding`: as permanent as the
    hold), or the create's own error."""
    started = time.perf_counter()
    sandbox = fleet_services.sandbox_claim_warm(fleet=fleet, holder=holder, lease_seconds=lease_seconds,
                                                started=started, count_hit=True, count_miss=True)
    if sandbox is None:
        sandbox = _claim_after_miss(fleet, holder, lease_seconds, wait_s, started)
    return Lease(sandbox=sandbox, fencing_token=sandbox.fencing_token, holder=holder,
                 claim_ms=(time.perf_counter() - started) * 1000)


def _claim_after_miss(fleet: Fleet, holder: str, lease_seconds: int, wait_s: float | None,
                      started: float) -> Sandbox:
    current = Fleet.objects.select_related("template").get(pk=fleet.pk)  # policy and status may have changed
    if current.status == Fleet.Status.DRAINING:
        raise SandboxError(f"fleet {fleet.name} is draining", reason="fleet_draining")
    if current.miss_policy == Fleet.MissPolicy.WAIT:
        wait = current.miss_wait_ms / 1000 if wait_s is None else wait_s
        sandbox = _wait_for_warm(current, holder, lease_seconds, wait, started)
        if sandbox is not None:
            return sandbox
    _check_not_held(current)
    return _claim_cold(current, holder, lease_seconds, started)


def _check_not_held(fleet: Fleet) -> None:
    """A held fleet creates nothing cold either: the create would fail (or queue) the way the reconciler's
    did. Permanent when the hold is (a bad image fails every time), else transient: retry later."""
    if fleet.status == Fleet.Status.HOLDING and fleet.hold_kind != Fleet.HoldKind.MAX_TOTAL:
        raise SandboxError(f"fleet {fleet.name} is holding: {fleet.hold_reason}", reason="fleet_holding",
                           permanent=fleet.hold_kind == Fleet.HoldKind.PERMANENT)


def _wait_for_warm(fleet: Fleet, holder: str, lease_seconds: int, wait_s: float, started: float) -> Sandbox | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(WAIT_POLL_S)
        sandbox = fleet_services.sandbox_claim_warm(fleet=fleet, holder=holder, lease_seconds=lease_seconds,
                                                    started=started, claim="waited")
        if sandbox is not None:
            return sandbox
    return None


def _claim_cold(fleet: Fleet, holder: str, lease_seconds: int, started: float) -> Sandbox:
    rows = fleet_services.sandboxes_request(fleet=fleet, n=1, creator_waits=True, cold=True)
    if not rows:
        raise SandboxError(f"fleet {fleet.name} is at max_total ({fleet.max_total}): no cold create",
                           reason="fleet_full")
    sandbox = sandbox_create(sandbox=rows[0], wait=True, cold=True)
    if not fleet_services.sandbox_lease_cold(sandbox=sandbox, holder=holder, lease_seconds=lease_seconds,
                                             started=started):
        _terminate_quietly(sandbox, "cold sandbox taken away before its lease")
        raise SandboxError(f"sandbox {sandbox.name} was reclaimed before it could be leased", reason="reclaimed")
    return sandbox


# --- using -----------------------------------------------------------------------------------------------

class _Fence:
    """The lease's fence check, run at most once: by the backend once the agent's connection is open and
    before the request is sent (the agent's greeting travels while the query runs), or, if the backend
    failed before that, by the caller, so a superseded lease is refused as stale rather than reported as an
    agent error."""

    def __init__(self, lease: Lease) -> None:
        self.lease, self.passed = lease, False
        self.passed_at = timezone.now()  # when the request went on its way (updated once the fence passed)

    def __call__(self) -> None:
        if not self.passed:
            fleet_services.sandbox_fence(sandbox_id=self.lease.sandbox.pk, fencing_token=self.lease.fencing_token)
            self.passed, self.passed_at = True, timezone.now()


def sandbox_exec(lease: Lease, command: str, *, timeout: float = 60.0, idle_timeout: float | None = None,
                 max_output: int = 64 * 1024, reason: str = "") -> ExecResult:
    """Exec under the caller's lease; refused (StaleFencingToken) if the lease was superseded, before anything
    reaches the sandbox. Every exec that passed the fence is logged, including one the agent could not run."""
    sandbox, fence, started = lease.sandbox, _Fence(lease), time.perf_counter()
    try:
        result = get_backend(sandbox.fleet.backend).exec(lease.handle, command, timeout=timeout,
                                                         idle_timeout=idle_timeout, max_output=max_output,
                                                         before_send=fence)
    except SandboxError as error:
        fence()  # a failure before the fence ran: stale beats unavailable
        _exec_recorded(lease, command, reason, fence.passed_at, exit_code=None,
                       duration_ms=(time.perf_counter() - started) * 1000, error=f"{error.reason}: {error}")
        raise
    _exec_recorded(lease, command, reason, fence.passed_at, exit_code=result.exit_code, duration_ms=result.duration_ms,
                   timed_out=result.timed_out)
    return result


def _exec_recorded(lease: Lease, command: str, reason: str, sent_at, **outcome) -> None:
    """The exec's log; the lease's first exec stamps first_exec_at with when it was sent."""
    first, lease.executed = not lease.executed, True
    fleet_services.sandbox_exec_recorded(sandbox=lease.sandbox, command=command, reason=reason,
                                         fencing_token=lease.fencing_token, started_at=sent_at, first=first,
                                         **outcome)


def sandbox_write_files(lease: Lease, files: dict[str, str]) -> None:
    """Write files under the caller's lease (in one exchange with the agent where it can), fenced once
    before anything is sent."""
    backend, fence = get_backend(lease.sandbox.fleet.backend), _Fence(lease)
    try:
        if files:
            backend.write_files(lease.handle, {path: text.encode() for path, text in files.items()},
                                before_send=fence)
    except SandboxError:
        fence()
        raise
    fence()  # no files: still refused under a stale lease
    fleet_services.event_record_relaxed(sandbox=lease.sandbox, kind="write_files", reason=f"{len(files)} file(s)",
                                        data={"paths": sorted(files)[:100], "fencing_token": lease.fencing_token})


def sandbox_release(lease: Lease, *, reason: str = "released") -> None:
    """End the lease. Single-use sandboxes are destroyed at once; a reusable one whose spec is still the
    fleet's goes back to the pool. A superseded lease releases nothing."""
    sandbox = lease.sandbox
    moved = fleet_services.sandbox_transition(
        sandbox=sandbox, to=S.RELEASED, expect=(S.LEASED,), where={"fencing_token": lease.fencing_token},
        reason=reason, lease_holder="", lease_expires_at=None)
    if not moved:
        return  # already reclaimed by the reconciler, which destroys it
    reusable, serving = _reuse_facts(sandbox)
    if reusable and serving:
        fleet_services.sandbox_transition(sandbox=sandbox, to=S.WARM, expect=(S.RELEASED,), reason="reuse")
        return
    sandbox_terminate(sandbox=sandbox, reason="retired" if reusable else "single-use")


def _reuse_facts(sandbox: Sandbox) -> tuple[bool, bool]:
    """(the row's template is reusable, the fleet still serves its spec: active, same template spec), read in
    one query with the joins, from the database (the fleet may have been drained or moved on since)."""
    own, fleets, status, current_hash = Sandbox.objects.filter(pk=sandbox.pk).values_list(
        "template__reusable", "fleet__template__reusable", "fleet__status", "fleet__template__spec_hash").get()
    reusable = own if sandbox.template_id else fleets  # rows made before versions were recorded use the fleet's
    return bool(reusable), status == Fleet.Status.ACTIVE and sandbox.spec_hash == current_hash


# --- ending ----------------------------------------------------------------------------------------------

def sandbox_terminate(*, sandbox: Sandbox, reason: str, expect: tuple[str, ...] = TERMINABLE) -> bool:
    """-> terminating -> destroy -> terminated. False (and nothing done) if the row was not in `expect`, e.g.
    another process is already terminating it. Raises SandboxError if the destroy failed: the row stays
    `terminating` and the reconciler retries."""
    if not fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATING, expect=expect, reason=reason,
                                             lease_holder="", lease_expires_at=None):
        return False
    sandbox_destroy(sandbox=sandbox)
    return True


def sandbox_destroy(*, sandbox: Sandbox) -> None:
    """Destroy a `terminating` row's object. Where the backend's destroy is final (local: it verifies that
    nothing is left) the row becomes terminated now; on Kubernetes the pod lingers for its grace period, so
    the row stays terminating (and keeps occupying capacity) until an observer sees the pod gone."""
    kind = sandbox.fleet.backend
    try:
        get_backend(kind).destroy(sandbox.name)
    except SandboxError as error:
        fleet_services.event_record(sandbox=sandbox, kind="destroy_failed", reason=f"{error.reason}: {error}")
        raise
    if destroy_is_final(kind):
        fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATED, expect=(S.TERMINATING,),
                                          reason="destroyed")


def _terminate_quietly(sandbox: Sandbox, reason: str) -> None:
    try:
        sandbox_terminate(sandbox=sandbox, reason=reason)
    except SandboxError as error:  # the row stays terminating; the reconciler retries
        log.warning("destroy of %s failed: %s", sandbox.name, error)


def sandboxes_terminate_all(*, backend_kind: str = "local", reason: str = "shutdown") -> int:
    """Terminate every live sandbox on one backend (the embedded stack's exit: it owns them all)."""
    live = Sandbox.objects.filter(fleet__backend=backend_kind).exclude(state=S.TERMINATED).select_related(
        "fleet__template", "template")
    count = 0
    for sandbox in live:
        try:
            if sandbox.state == S.TERMINATING:
                sandbox_destroy(sandbox=sandbox)
            else:
                sandbox_terminate(sandbox=sandbox, reason=reason)
            count += 1
        except SandboxError as error:
            log.warning("terminate %s at shutdown failed: %s", sandbox.name, error)
    return count
