"""Local sandbox lifecycle: N sandboxes each created, given 4 execs (`echo hi`), and destroyed.

    .venv/bin/python benchmarks/sandbox_lifecycle.py [--n 1000] [--concurrency 8] [--root DIR]

Baseline, measured in the same run from this process: the floor, the same command in a fresh
`bwrap <the sandbox's namespace and system options> bash -c 'echo hi'`, i.e. what one exec would cost if
each command got a brand-new sandbox instead of going to a running agent. It is sampled on a side thread
during the lifecycle run (floor_p50_ms: same load as the execs) and, for reference, alone before it
(floor_idle_p50_ms).

Targets on a 2-core machine: success_rate 1.0, leaked 0, n=1000 in under 30 s,
exec_p50_ms <= 1.5 x floor_p50_ms + 5.

The last line printed is one JSON object: n, concurrency, seconds, success_rate, leaked (processes +
directories + cgroups + mounts + unreaped children left after), leaked_detail, exec_p50_ms, exec_p99_ms,
create_p50_ms, destroy_p50_ms, cpu_ms_per_sandbox, floor_p50_ms, floor_idle_p50_ms, floor_samples,
limits_enforced, errors (the first
few), and load_avg (the 1-minute load average at the end: the machine may be shared).
`run_lifecycle(backend, n, concurrency)` is importable for other benchmarks (it returns the same figures).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.sandboxes import bwrap, procs  # noqa: E402
from workers.sandboxes.base import SandboxBackend, SandboxSpec  # noqa: E402

EXECS_PER_SANDBOX = 4
COMMAND = "echo hi"


@dataclass
class Outcome:
    """What happened to one sandbox."""

    name: str
    ok: bool = False
    error: str = ""
    create_ms: float = 0.0
    destroy_ms: float = 0.0
    exec_ms: list[float] = field(default_factory=list)


def run_lifecycle(backend: SandboxBackend, n: int, concurrency: int, *, prefix: str = "") -> dict:
    """Create, exec 4 times and destroy `n` sandboxes on `backend`, `concurrency` at a time.
    Returns n, concurrency, seconds, success_rate, exec/create/destroy percentiles (ms), errors, names."""
    prefix = prefix or f"bench-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i}" for i in range(n)]
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one_lifecycle, [backend] * n, names))
    seconds = time.perf_counter() - started
    cpu_used = cpu_seconds() - cpu_before
    exec_ms = [ms for o in outcomes for ms in o.exec_ms]
    return {
        "n": n,
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "success_rate": sum(o.ok for o in outcomes) / n if n else 1.0,
        "exec_p50_ms": percentile(exec_ms, 50),
        "exec_p99_ms": percentile(exec_ms, 99),
        "create_p50_ms": percentile([o.create_ms for o in outcomes if o.create_ms], 50),
        "destroy_p50_ms": percentile([o.destroy_ms for o in outcomes if o.destroy_ms], 50),
        "cpu_ms_per_sandbox": round(cpu_used / n * 1000, 2) if n else 0.0,
        "errors": [f"{o.name}: {o.error}" for o in outcomes if o.error][:5],
        "names": names,
    }


def one_lifecycle(backend: SandboxBackend, name: str) -> Outcome:
    outcome = Outcome(name=name)
    try:
        t0 = time.perf_counter()
        handle = backend.create(SandboxSpec(name=name, labels={"trove.dev/benchmark": "lifecycle"}))
        outcome.create_ms = (time.perf_counter() - t0) * 1000
        ok = True
        for _ in range(EXECS_PER_SANDBOX):
            t0 = time.perf_counter()
            result = backend.exec(handle, COMMAND, timeout=30)
            outcome.exec_ms.append((time.perf_counter() - t0) * 1000)
            ok = ok and result.exit_code == 0 and result.stdout == "hi\n"
        if not ok:
            outcome.error = "an exec did not print hi"
    except Exception as exc:  # counted, not fatal: the run measures the success rate
        outcome.error = f"{type(exc).__name__}: {exc}"
        ok = False
    finally:
        t0 = time.perf_counter()
        try:
            backend.destroy(name)
        except Exception as exc:
            outcome.error = outcome.error or f"destroy: {exc}"
            ok = False
        outcome.destroy_ms = (time.perf_counter() - t0) * 1000
    outcome.ok = ok
    return outcome


def measure_floor(samples: int, *, bwrap_path: str = "/usr/bin/bwrap") -> list[float]:
    """Wall time (ms) of `bwrap ... bash -c 'echo hi'` with the sandbox's namespace and system options."""
    return [floor_once(bwrap_path)[0] for _ in range(samples)]


def floor_once(bwrap_path: str = "/usr/bin/bwrap") -> tuple[float, float]:
    """One floor run: (wall ms, CPU seconds it used, from wait4 so other threads' children don't count)."""
    argv = [bwrap_path, *bwrap.namespace_args(False), *bwrap.system_binds("/"),
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "bash", "-c", COMMAND]
    t0 = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    wall_ms = (time.perf_counter() - t0) * 1000
    if out != b"hi\n":
        raise RuntimeError(f"floor command failed: {err.decode()}")
    return wall_ms, usage.ru_utime + usage.ru_stime


class FloorDuringRun:
    """Samples the floor on a side thread, one run at a time, for as long as the `with` block lasts: the
    execs and their baseline then see the same machine load (this machine may be shared)."""

    def __init__(self, interval: float = 0.1) -> None:
        self.samples: list[float] = []
        self.cpu_seconds = 0.0  # what the sampling itself used, to keep it out of the run's CPU figure
        self.interval = interval  # pause between samples, so sampling barely loads the machine itself
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> FloorDuringRun:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            wall_ms, cpu = floor_once()
            self.samples.append(wall_ms)
            self.cpu_seconds += cpu


def count_leaks(backend, names: list[str]) -> dict[str, int]:
    """What the run left behind: processes naming the root, sandbox directories, cgroups, mounts, and
    children of this process that were never reaped."""
    root = getattr(backend, "root", "")
    dirs = [e for e in os.listdir(root) if not e.startswith(".")] if root and os.path.isdir(root) else []
    cgroup_dirs = [d for name in names for d in getattr(backend, "cgroup_dirs", lambda _: [])(name)
                   if os.path.exists(d)]
    with open("/proc/mounts") as f:
        mounts = [line for line in f if root and root in line]
    return {
        "processes": len(procs.processes_mentioning(root)) if root else 0,
        "dirs": len(dirs),
        "cgroups": len(cgroup_dirs),
        "mounts": len(mounts),
        "zombie_children": len(zombie_children()),
    }


def zombie_children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z" and fields[1].decode() == me:
            found.append(int(entry))
    return found


def cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children (the sandboxes' processes). Kernel work
    done elsewhere (namespace teardown in kworkers) is not included."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return round(ordered[index], 3)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--root", default="", help="sandbox root (default: a fresh temporary directory)")
    parser.add_argument("--floor-samples", type=int, default=50)
    parser.add_argument("--claims", type=int, default=500,
                        help="warm claims to time through the fleet services (needs DATABASE_URL); 0 skips")
    args = parser.parse_args(argv)

    from workers.sandboxes.local import LocalBackend

    root = args.root or tempfile.mkdtemp(prefix="trove-bench-")
    os.chmod(root, 0o711)
    backend = LocalBackend(root)
    idle_floor = measure_floor(args.floor_samples)
    print(f"floor before the run: bare bwrap + bash -c {COMMAND!r}, {args.floor_samples} runs: "
          f"p50 {percentile(idle_floor, 50)} ms")
    with FloorDuringRun() as floor:
        figures = run_lifecycle(backend, args.n, args.concurrency)
    names = figures.pop("names")
    figures["cpu_ms_per_sandbox"] = round(figures["cpu_ms_per_sandbox"] - floor.cpu_seconds * 1000 / args.n, 2)
    leaks = count_leaks(backend, names)
    figures.update(leaked=sum(leaks.values()), leaked_detail=leaks, floor_p50_ms=percentile(floor.samples, 50),
                   floor_samples=len(floor.samples), floor_idle_p50_ms=percentile(idle_floor, 50),
                   limits_enforced=backend.limits_enforced, load_avg=round(os.getloadavg()[0], 2))
    target_exec = round(1.5 * figures["floor_p50_ms"] + 5, 3)
    print(f"{args.n} lifecycles x {EXECS_PER_SANDBOX} execs at concurrency {args.concurrency}: "
          f"{figures['seconds']} s, success {figures['success_rate']:.3f}, leaked {figures['leaked']}")
    print(f"exec p50 {figures['exec_p50_ms']} ms (target <= 1.5 x floor + 5 = {target_exec} ms), "
          f"p99 {figures['exec_p99_ms']} ms; create p50 {figures['create_p50_ms']} ms; "
          f"destroy p50 {figures['destroy_p50_ms']} ms")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    figures.update(claim_figures(args.claims))
    print(json.dumps(figures))


def claim_figures(n: int) -> dict:
    """Warm claim -> first exec through the real fleet services on Postgres (benchmarks/claims.py)."""
    if not n or not os.environ.get("DATABASE_URL"):
        print("claim_to_first_exec: skipped (set DATABASE_URL=postgres://... to measure it)")
        return {"claim_to_first_exec_p50_ms": None, "claim_to_first_exec_p99_ms": None}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from claims import measure_claims

    claims = measure_claims(n)
    print(f"claims: {json.dumps(claims)}")
    return {key: claims[key] for key in claims if key.startswith("claim_to_first_exec")}


if __name__ == "__main__":
    main(sys.argv[1:])
