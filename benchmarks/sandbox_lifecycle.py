"""Local sandbox lifecycle: N sandboxes each created, given 4 execs (`echo hi`), and destroyed.

    .venv/bin/python benchmarks/sandbox_lifecycle.py [--n 1000] [--concurrency 8] [--root DIR] [--claims 500]
    quick: .venv/bin/python benchmarks/sandbox_lifecycle.py --n 100 --claims 0

Baseline, measured in the same run on the same sandboxes: the agent floor. Every Trove exec
(`LocalBackend.exec`) is paired with one exec of the same command sent straight to the same, already running
in-sandbox agent by a minimal client written here: connect to the agent's socket, read the greeting, send the
signed request, read and verify the signed reply. That is the wire protocol and nothing else (no socket
ownership checks, no O_PATH connect, no typed errors, no ExecResult), so it is what any client of a running
agent has to pay. The two alternate (which goes first alternates too), so they see the same machine load.

Targets on a 2-core machine: success_rate 1.0, leaked 0, n=1000 in under 30 s (the run also serves the
floor's execs), exec_p50_ms <= 1.5 x agent_floor_p50_ms, exec_p99_ms <= 3 x agent_floor_p99_ms.

The last line printed is one JSON object: n, concurrency, seconds, success_rate, leaked (processes +
directories + cgroups + mounts + unreaped children left after; the benchmark's own process and its parents,
whose command lines may name `--root`, are not counted), leaked_detail, exec_p50_ms, exec_p99_ms,
agent_floor_p50_ms, agent_floor_p99_ms, exec_vs_floor_p50, exec_vs_floor_p99, create_p50_ms,
destroy_p50_ms, cpu_ms_per_sandbox (the floor's execs included), limits_enforced, errors (the first few),
load_avg (the 1-minute load average at the end: the machine may be shared), and the warm-claim figures
(claim_to_first_exec_p50_ms / _p99_ms, None without DATABASE_URL or with --claims 0).
`run_lifecycle(backend, n, concurrency)` is importable for other benchmarks (it returns the same figures).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import resource
import secrets
import shutil
import socket
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.sandboxes import procs  # noqa: E402
from workers.sandboxes.agent import GREETING, REQUEST_CONTEXT, RESPONSE_CONTEXT, split_signed  # noqa: E402
from workers.sandboxes.base import SandboxBackend, SandboxHandle, SandboxSpec  # noqa: E402

EXECS_PER_SANDBOX = 4
COMMAND = "echo hi"
SUN_PATH_MAX = 107  # longest socket path connect() takes directly (sockaddr_un.sun_path, less the NUL)


@dataclass
class Outcome:
    """What happened to one sandbox."""

    name: str
    ok: bool = False
    error: str = ""
    create_ms: float = 0.0
    destroy_ms: float = 0.0
    exec_ms: list[float] = field(default_factory=list)
    floor_ms: list[float] = field(default_factory=list)


def run_lifecycle(backend: SandboxBackend, n: int, concurrency: int, *, prefix: str = "") -> dict:
    """Create, exec 4 times (each paired with a floor exec) and destroy `n` sandboxes on `backend`,
    `concurrency` at a time. Returns n, concurrency, seconds, success_rate, exec/floor/create/destroy
    percentiles (ms) and their ratios, errors, names."""
    prefix = prefix or f"bench-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i}" for i in range(n)]
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one_lifecycle, [backend] * n, names))
    seconds = time.perf_counter() - started
    cpu_used = cpu_seconds() - cpu_before
    exec_ms = [ms for o in outcomes for ms in o.exec_ms]
    floor_ms = [ms for o in outcomes for ms in o.floor_ms]
    figures = {
        "n": n,
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "success_rate": sum(o.ok for o in outcomes) / n if n else 1.0,
        "exec_p50_ms": percentile(exec_ms, 50),
        "exec_p99_ms": percentile(exec_ms, 99),
        "agent_floor_p50_ms": percentile(floor_ms, 50),
        "agent_floor_p99_ms": percentile(floor_ms, 99),
        "create_p50_ms": percentile([o.create_ms for o in outcomes if o.create_ms], 50),
        "destroy_p50_ms": percentile([o.destroy_ms for o in outcomes if o.destroy_ms], 50),
        "cpu_ms_per_sandbox": round(cpu_used / n * 1000, 2) if n else 0.0,
        "errors": [f"{o.name}: {o.error}" for o in outcomes if o.error][:5],
        "names": names,
    }
    figures["exec_vs_floor_p50"] = ratio(figures["exec_p50_ms"], figures["agent_floor_p50_ms"])
    figures["exec_vs_floor_p99"] = ratio(figures["exec_p99_ms"], figures["agent_floor_p99_ms"])
    return figures


def one_lifecycle(backend: SandboxBackend, name: str) -> Outcome:
    outcome = Outcome(name=name)
    try:
        t0 = time.perf_counter()
        handle = backend.create(SandboxSpec(name=name, labels={"trove.dev/benchmark": "lifecycle"}))
        outcome.create_ms = (time.perf_counter() - t0) * 1000
        ok = True
        for turn in range(EXECS_PER_SANDBOX):
            # Alternate which of the pair goes first: the second of two back-to-back execs may find caches warm.
            if turn % 2:
                outcome.floor_ms.append(agent_floor_exec(handle))
                ok = trove_exec(backend, handle, outcome) and ok
            else:
                ok = trove_exec(backend, handle, outcome) and ok
                outcome.floor_ms.append(agent_floor_exec(handle))
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


def trove_exec(backend: SandboxBackend, handle: SandboxHandle, outcome: Outcome) -> bool:
    """One exec through Trove's backend, timed into `outcome`; True if it printed hi."""
    t0 = time.perf_counter()
    result = backend.exec(handle, COMMAND, timeout=30)
    outcome.exec_ms.append((time.perf_counter() - t0) * 1000)
    return result.exit_code == 0 and result.stdout == "hi\n"


def agent_floor_exec(handle: SandboxHandle, command: str = COMMAND) -> float:
    """Wall time (ms) of `command` sent straight to the sandbox's running agent with the bare wire protocol
    (see the module docstring). Raises RuntimeError if the reply is not signed or the command failed."""
    secret = handle.secret.encode()
    body = json.dumps({"op": "exec", "nonce": secrets.token_hex(16), "cmd": command, "timeout": 30}).encode()
    t0 = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        connect_unix(sock, handle.endpoint.removeprefix("unix:"))
        stream = sock.makefile("rb")
        nonce = stream.readline().removeprefix(GREETING).rstrip(b"\n")
        request_mac = hmac.new(secret, REQUEST_CONTEXT + nonce + b"\n" + body, hashlib.sha256).hexdigest().encode()
        sock.sendall(request_mac + b" " + body + b"\n")
        reply_mac, reply = split_signed(stream.readline())
        expected = hmac.new(secret, RESPONSE_CONTEXT + nonce + b"\n" + request_mac + b"\n" + reply, hashlib.sha256)
        signed = hmac.compare_digest(reply_mac, expected.hexdigest().encode())
        answer = json.loads(reply)
    wall_ms = (time.perf_counter() - t0) * 1000
    if not signed or answer.get("stdout") != "hi\n":
        raise RuntimeError(f"floor exec failed (signed: {signed}): {reply[:200]!r}")
    return wall_ms


def connect_unix(sock: socket.socket, path: str) -> None:
    """connect() to a unix socket, through an O_PATH descriptor when the path is too long for sun_path."""
    if len(path.encode()) <= SUN_PATH_MAX:
        sock.connect(path)
        return
    fd = os.open(path, os.O_PATH)
    try:
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def count_leaks(backend, names: list[str]) -> dict[str, int]:
    """What the run left behind: processes naming the root (but this benchmark's own process and its
    parents, whose command lines name it when --root is given), sandbox directories, cgroups, mounts, and
    children of this process that were never reaped."""
    root = getattr(backend, "root", "")
    root = str(root) if root else ""
    dirs = [e for e in os.listdir(root) if not e.startswith(".")] if root and os.path.isdir(root) else []
    cgroup_dirs = [d for name in names for d in getattr(backend, "cgroup_dirs", lambda _: [])(name)
                   if os.path.exists(d)]
    with open("/proc/mounts") as f:
        mounts = [line for line in f if root and root in line]
    ours = own_lineage()
    processes = [pid for pid in procs.processes_mentioning(root) if pid not in ours] if root else []
    return {
        "processes": len(processes),
        "dirs": len(dirs),
        "cgroups": len(cgroup_dirs),
        "mounts": len(mounts),
        "zombie_children": len(zombie_children()),
    }


def own_lineage() -> set[int]:
    """This process and its ancestors (the shell or runner that started the benchmark), up to init."""
    lineage, pid = set(), os.getpid()
    while pid > 1 and pid not in lineage:
        lineage.add(pid)
        pid = parent_pid(pid)
    return lineage


def parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


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


def ratio(value: float, baseline: float) -> float | None:
    return round(value / baseline, 3) if baseline else None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--root", default="", help="sandbox root (default: a fresh temporary directory)")
    parser.add_argument("--claims", type=int, default=500,
                        help="warm claims to time through the fleet services (needs DATABASE_URL); 0 skips")
    args = parser.parse_args(argv)

    from workers.sandboxes.local import LocalBackend

    root = args.root or tempfile.mkdtemp(prefix="trove-bench-")
    os.makedirs(root, exist_ok=True)
    os.chmod(root, 0o711)
    backend = LocalBackend(root)
    figures = run_lifecycle(backend, args.n, args.concurrency)
    names = figures.pop("names")
    leaks = count_leaks(backend, names)
    figures.update(leaked=sum(leaks.values()), leaked_detail=leaks, limits_enforced=backend.limits_enforced,
                   load_avg=round(os.getloadavg()[0], 2))
    print(f"{args.n} lifecycles x {EXECS_PER_SANDBOX} execs (+ as many floor execs) at concurrency "
          f"{args.concurrency}: {figures['seconds']} s, success {figures['success_rate']:.3f}, "
          f"leaked {figures['leaked']}")
    print(f"exec p50 {figures['exec_p50_ms']} ms vs agent floor {figures['agent_floor_p50_ms']} ms = "
          f"{figures['exec_vs_floor_p50']}x (target <= 1.5x); p99 {figures['exec_p99_ms']} vs "
          f"{figures['agent_floor_p99_ms']} ms = {figures['exec_vs_floor_p99']}x (target <= 3x); "
          f"create p50 {figures['create_p50_ms']} ms; destroy p50 {figures['destroy_p50_ms']} ms")
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
