"""Warm claim to first exec: a real local (bubblewrap) fleet kept warm by the real reconciler, claimed through
the real claim path on Postgres, then `true` run under the lease.

    DATABASE_URL=postgres://... SECRET_KEY=x .venv/bin/python benchmarks/claims.py [--n 500] [--pool 8]

Each sample is one `fleet_ops.sandbox_claim` (SELECT ... FOR UPDATE SKIP LOCKED, the lease UPDATE and its event
in one transaction, plus the hit counter) followed by the lease's first `fleet_ops.sandbox_exec(lease, "true")`
(one fencing UPDATE, the agent call, one exec event): the time a rollout waits from asking for a sandbox to
its first command having run. Between samples (not timed) the lease is released, which destroys the
single-use sandbox, and the test waits for the background reconciler to have a warm one ready, so every
sample is a warm hit.

Baseline, measured in the same run on the same sandbox: the same `true` sent straight to the agent
(`backend.exec`, no database), exec_floor_p50_ms. claim_to_first_exec minus the floor is what the
control plane adds. Targets: claim_to_first_exec_p50_ms < 20, claim_to_first_exec_p99_ms < 100.

The database needs Trove's schema (this runs `migrate` first). Everything the run makes (template, fleet,
sandboxes, events) is removed at the end. The last line printed is one JSON object.
`measure_claims(n, pool_size=...)` is importable and returns the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def setup_django() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def measure_claims(n: int = 500, *, pool_size: int = 8, root: str | None = None, migrate: bool = True) -> dict:
    """Claim -> first exec latency over `n` warm claims; returns the figures (see the module doc)."""
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("measure_claims needs Postgres: set DATABASE_URL=postgres://...")
    if migrate:
        call_command("migrate", verbosity=0)
    from workers.sandboxes import registry
    from workers.sandboxes.local import LocalBackend

    root = root or tempfile.mkdtemp(prefix="trove-claims-")
    os.chmod(root, 0o711)
    backend = LocalBackend(root)
    registry.set_backend("local", backend)
    fleet = _make_fleet(pool_size)
    refill = _Refiller(fleet.pk, root)
    try:
        refill.start()
        figures = _measure(fleet, backend, n)
    finally:
        refill.stop()
        _clean_up(fleet, backend)
        shutil.rmtree(root, ignore_errors=True)
    figures.update(n=n, pool_size=pool_size, load_avg=round(os.getloadavg()[0], 2),
                   limits_enforced=backend.limits_enforced)
    return figures


def _make_fleet(pool_size: int):
    from webapp.fleets import services

    tag = uuid.uuid4().hex[:8]
    template = services.template_create(name=f"bench-claims-{tag}", network="none")
    return services.fleet_create(name=f"bench-claims-{tag}", template=template, backend="local",
                                 sizing="fixed", min_warm=pool_size, max_warm=pool_size,
                                 max_total=pool_size * 3, refill_per_minute=100_000)


class _Refiller:
    """The real reconciler, round after round, in its own process (as beat and its worker are): it shares
    no interpreter lock with the claimer. It stops, destroying what it made, when its stdin closes."""

    CODE = """
import os, sys, threading
sys.path.insert(0, {repo!r})
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
import django
django.setup()
from webapp.fleets.models import Fleet, Sandbox
from workers import fleet_ops
from workers.reconciler import fleet_reconcile
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    fleet_reconcile(fleet_id={fleet_id})
    stop.wait({period})
fleet = Fleet.objects.get(pk={fleet_id})
for sandbox in Sandbox.objects.filter(fleet=fleet, state__in=fleet_ops.TERMINABLE):
    sandbox.fleet = fleet
    fleet_ops.sandbox_terminate(sandbox=sandbox, reason="benchmark done")
"""

    PERIOD_S = 0.5  # a fast beat (the default schedule is 5 s): refills keep up with the claims

    def __init__(self, fleet_id: int, root: str) -> None:
        self.fleet_id, self.root = fleet_id, root
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        from django.conf import settings

        db = settings.DATABASES["default"]
        env = dict(os.environ, TROVE_SANDBOX_ROOT=self.root,
                   DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}")
        code = self.CODE.format(repo=str(REPO), fleet_id=self.fleet_id, period=self.PERIOD_S)
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, env=env, cwd=REPO)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _measure(fleet, backend, n: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.fleets.models import Fleet
    from workers import fleet_ops

    fleet = Fleet.objects.select_related("template").get(pk=fleet.pk)  # as the runner holds it
    totals, claims, floors = [], [], []
    _wait_warm(fleet.pk, fleet.min_warm)
    with CaptureQueriesContext(connection) as queries:  # one sample, untimed: how many round trips
        lease = _sample(fleet_ops, fleet, backend)[3]
    _release(fleet_ops, lease)  # not the path: outside the count
    started = time.perf_counter()
    for _ in range(n):
        _wait_warm(fleet.pk, 1)
        total, claim, floor, lease = _sample(fleet_ops, fleet, backend)
        totals.append(total)
        claims.append(claim)
        floors.append(floor)
        _release(fleet_ops, lease)
    seconds = time.perf_counter() - started
    fleet.refresh_from_db()
    return {
        "claim_to_first_exec_p50_ms": _pct(totals, 50), "claim_to_first_exec_p99_ms": _pct(totals, 99),
        "claim_p50_ms": _pct(claims, 50), "claim_p99_ms": _pct(claims, 99),
        "exec_floor_p50_ms": _pct(floors, 50), "exec_floor_p99_ms": _pct(floors, 99),
        "control_plane_p50_ms": round(statistics.median(t - f for t, f in zip(totals, floors, strict=True)), 3),
        "queries_claim_to_first_exec": len(queries.captured_queries),
        "warm_hits": fleet.claims_hit, "misses": fleet.claims_miss, "seconds": round(seconds, 2),
    }


def _sample(fleet_ops, fleet, backend):
    """(claim -> first exec ms, claim ms, floor ms, lease). The floor runs after, on the same sandbox."""
    started = time.perf_counter()
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="bench", wait_s=0)
    claimed = time.perf_counter()
    result = fleet_ops.sandbox_exec(lease, "true")
    done = time.perf_counter()
    assert result.exit_code == 0, result
    floor_started = time.perf_counter()
    backend.exec(lease.handle, "true")
    floor = (time.perf_counter() - floor_started) * 1000
    return (done - started) * 1000, (claimed - started) * 1000, floor, lease


def _release(fleet_ops, lease) -> None:
    fleet_ops.sandbox_release(lease)


def _wait_warm(fleet_id: int, at_least: int, timeout: float = 120.0) -> None:
    from webapp.fleets.models import Sandbox

    deadline = time.monotonic() + timeout
    while Sandbox.objects.filter(fleet_id=fleet_id, state=Sandbox.State.WARM).count() < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not reach {at_least} warm sandbox(es) in {timeout} s")
        time.sleep(0.005)


def _clean_up(fleet, backend) -> None:
    from webapp.fleets import services
    from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox
    from workers import fleet_ops

    services.fleet_drain(fleet=fleet, reason="benchmark done")
    for sandbox in Sandbox.objects.filter(fleet_id=fleet.pk).exclude(state=Sandbox.State.TERMINATED):
        sandbox.fleet = fleet
        fleet_ops.sandbox_terminate(sandbox=sandbox, reason="benchmark done",
                                    expect=(*fleet_ops.TERMINABLE, Sandbox.State.TERMINATING))
    for handle in backend.list({}):  # this run's own root: nothing else lives there
        backend.destroy(handle.name)
    template_id = fleet.template_id
    Sandbox.objects.filter(fleet_id=fleet.pk).delete()
    Fleet.objects.filter(pk=fleet.pk).delete()
    EnvironmentTemplate.objects.filter(pk=template_id).delete()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered))) - 1))], 3)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--pool", type=int, default=8, help="warm sandboxes the reconciler keeps")
    parser.add_argument("--root", default="", help="sandbox root (default: a fresh temporary directory)")
    args = parser.parse_args(argv)
    figures = measure_claims(args.n, pool_size=args.pool, root=args.root or None)
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1:])
