"""Fleet operations that need a backend: provision, claim (warm or cold), exec with fencing, release.

The database side of every transition is in `webapp.fleets.services`; this module sequences backend calls
around it. A backend call never happens inside a database transaction (they can take seconds).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from webapp.fleets import services as fleet_services
from webapp.fleets.models import Fleet, Sandbox
from workers.sandboxes.base import ExecResult, SandboxError, SandboxHandle, SandboxSpec
from workers.sandboxes.registry import get_backend

log = logging.getLogger("trove.fleets")
S = Sandbox.State
DEFAULT_LEASE_S = 300


def spec_for(sandbox: Sandbox) -> SandboxSpec:
    template = sandbox.fleet.template
    return SandboxSpec(
        name=sandbox.name,
        labels={"trove.dev/fleet": str(sandbox.fleet_id), "trove.dev/sandbox": sandbox.name},
        image=template.image,
        rootfs=template.rootfs,
        cpu=template.cpu,
        memory_mb=template.memory_mb,
        pids=template.pids,
        disk_mb=template.disk_mb,
        network=template.network,
    )


def sandbox_provision(*, fleet: Fleet, timeout: float = 60.0) -> Sandbox:
    """requested -> provisioning -> warm (or failed with the backend's reason). Returns the row."""
    sandbox = fleet_services.sandbox_request(fleet=fleet)
    sandbox.fleet = fleet
    fleet_services.sandbox_transition(sandbox=sandbox, to=S.PROVISIONING, expect=(S.REQUESTED,), reason="create")
    backend = get_backend(fleet.backend)
    try:
        handle = backend.create(spec_for(sandbox), wait=True, timeout=timeout)
    except SandboxError as error:
        fleet_services.sandbox_transition(
            sandbox=sandbox, to=S.FAILED, expect=(S.PROVISIONING,), reason=f"{error.reason}: {error}",
            failure_reason=str(error)[:2000],
        )
        _destroy_quietly(fleet.backend, sandbox.name)
        raise
    fleet_services.sandbox_transition(
        sandbox=sandbox, to=S.WARM, expect=(S.PROVISIONING,), reason="agent ready",
        endpoint=handle.endpoint, agent_secret=handle.secret,
    )
    return sandbox


@dataclass
class Lease:
    """What a rollout holds while it uses a sandbox. Every exec is checked against `fencing_token`."""

    sandbox: Sandbox
    fencing_token: int
    holder: str

    @property
    def handle(self) -> SandboxHandle:
        return SandboxHandle(name=self.sandbox.name, state="ready", endpoint=self.sandbox.endpoint,
                             secret=self.sandbox.agent_secret)


def sandbox_claim(*, fleet: Fleet, holder: str, lease_seconds: int = DEFAULT_LEASE_S, wait_s: float = 2.0) -> Lease:
    """A warm sandbox if one is there; otherwise, by fleet policy, wait briefly for a refill or create cold."""
    sandbox = fleet_services.sandbox_claim_warm(fleet=fleet, holder=holder, lease_seconds=lease_seconds)
    if sandbox is None and fleet.miss_policy == Fleet.MissPolicy.WAIT:
        deadline = time.monotonic() + wait_s
        while sandbox is None and time.monotonic() < deadline:
            time.sleep(0.05)
            sandbox = fleet_services.sandbox_claim_warm(fleet=fleet, holder=holder, lease_seconds=lease_seconds)
    if sandbox is None:
        sandbox = fleet_services.sandbox_lease_cold(
            sandbox=sandbox_provision(fleet=fleet), holder=holder, lease_seconds=lease_seconds
        )
    sandbox.fleet = fleet
    return Lease(sandbox=sandbox, fencing_token=sandbox.fencing_token, holder=holder)


def sandbox_exec(lease: Lease, command: str, *, timeout: float = 60.0, idle_timeout: float | None = None,
                 max_output: int = 64 * 1024, reason: str = "") -> ExecResult:
    """Exec under the caller's lease; refused (StaleFencingToken) if the lease was superseded."""
    fleet_services.sandbox_check_fence(sandbox_id=lease.sandbox.pk, fencing_token=lease.fencing_token)
    backend = get_backend(lease.sandbox.fleet.backend)
    result = backend.exec(lease.handle, command, timeout=timeout, idle_timeout=idle_timeout, max_output=max_output)
    fleet_services.sandbox_exec_recorded(
        sandbox=lease.sandbox, command=command, exit_code=result.exit_code, duration_ms=result.duration_ms,
        reason=reason, timed_out=result.timed_out,
    )
    return result


def sandbox_write_files(lease: Lease, files: dict[str, str]) -> None:
    fleet_services.sandbox_check_fence(sandbox_id=lease.sandbox.pk, fencing_token=lease.fencing_token)
    backend = get_backend(lease.sandbox.fleet.backend)
    for path, text in files.items():
        backend.write_file(lease.handle, path, text.encode())


def sandbox_release(lease: Lease, *, reason: str = "released") -> None:
    """End the lease. Single-use sandboxes are destroyed at once; nothing is left behind."""
    sandbox = lease.sandbox
    moved = fleet_services.sandbox_transition(sandbox=sandbox, to=S.RELEASED, expect=(S.LEASED,), reason=reason)
    if not moved:
        return  # already reclaimed by the reconciler, which destroys it
    if sandbox.fleet.template.reusable:
        fleet_services.sandbox_transition(sandbox=sandbox, to=S.WARM, expect=(S.RELEASED,), reason="reuse",
                                          lease_holder="", lease_expires_at=None)
        return
    sandbox_terminate(sandbox=sandbox, reason="single-use")


def sandbox_terminate(*, sandbox: Sandbox, reason: str) -> None:
    live = tuple(Sandbox.LIVE_STATES) + (S.FAILED, S.LOST)
    fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATING, expect=live, reason=reason)
    get_backend(sandbox.fleet.backend).destroy(sandbox.name)
    fleet_services.sandbox_transition(sandbox=sandbox, to=S.TERMINATED, expect=(S.TERMINATING,), reason="destroyed")


def _destroy_quietly(backend_kind: str, name: str) -> None:
    try:
        get_backend(backend_kind).destroy(name)
    except SandboxError as error:  # the reconciler will find it by label
        log.warning("destroy of %s after a failed create failed: %s", name, error)


def sandboxes_terminate_all(*, backend_kind: str = "local", reason: str = "shutdown") -> int:
    """Terminate every live sandbox on one backend (the embedded stack's exit: it owns them all)."""
    live = Sandbox.objects.filter(fleet__backend=backend_kind).exclude(state=S.TERMINATED).select_related(
        "fleet__template")
    count = 0
    for sandbox in live:
        try:
            sandbox_terminate(sandbox=sandbox, reason=reason)
            count += 1
        except SandboxError as error:
            log.warning("terminate %s at shutdown failed: %s", sandbox.name, error)
    return count
