"""Kubernetes sandbox lifecycle: N sandboxes each created (pod + secret, waited Ready, agent pinged), given
one exec (`echo hi`, through the agent at the pod IP) and destroyed, against a real kube-apiserver on
loopback with the test kubelet running each pod's agent as a local process.

    .venv/bin/python benchmarks/kube_lifecycle.py [--n 200] [--concurrency 16] [--baseline-n 20]

Baseline, measured in the same run: the same lifecycle one sandbox at a time (`--baseline-n` of them), so
the concurrent figure reads as a speed-up over sequential use; and the floor for API calls, 3 per sandbox
(create the pod, one watch until Ready, delete it): the backend's extra calls are the secret and the
fleet's owner object.

The last line printed is one JSON object: n, concurrency, seconds, success_rate, leaked (pods + secrets +
agent processes left after the run, once deletions settle), leaked_detail, api_calls_per_sandbox,
api_calls_floor, api_calls_by_method, create_p50_ms, create_p95_ms, exec_p50_ms, destroy_p50_ms,
sandboxes_per_s, baseline_sequential_per_sandbox_ms, speedup_vs_sequential, errors (the first few).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client as k8s  # noqa: E402

from tests.kube.cluster import start_cluster  # noqa: E402
from tests.kube.kubelet import TestKubelet  # noqa: E402
from workers.sandboxes.base import SandboxSpec  # noqa: E402
from workers.sandboxes.kubernetes import LABEL_FLEET, KubernetesBackend, KubeSandboxConfig  # noqa: E402

NAMESPACE = "bench"
IMAGE = "registry.trove.test/sandbox@sha256:" + "0" * 64
API_CALLS_FLOOR = 3
SETTLE_SECONDS = 60.0


@dataclass
class Outcome:
    name: str
    ok: bool = False
    error: str = ""
    create_ms: float = 0.0
    exec_ms: float = 0.0
    destroy_ms: float = 0.0


def one_lifecycle(backend: KubernetesBackend, name: str, fleet: str) -> Outcome:
    outcome = Outcome(name)
    try:
        t0 = time.perf_counter()
        handle = backend.create(SandboxSpec(name=name, labels={LABEL_FLEET: fleet}, cpu=0.1, memory_mb=128),
                                timeout=120)
        t1 = time.perf_counter()
        result = backend.exec(handle, "echo hi", timeout=30)
        t2 = time.perf_counter()
        backend.destroy(name)
        t3 = time.perf_counter()
        outcome.create_ms, outcome.exec_ms, outcome.destroy_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3
        outcome.ok = result.stdout == "hi\n" and result.exit_code == 0
        if not outcome.ok:
            outcome.error = f"exec gave {result!r}"
    except Exception as exc:  # a benchmark counts failures instead of stopping at the first
        outcome.error = f"{exc.__class__.__name__}: {exc}"
        try:
            backend.destroy(name)
        except Exception as cleanup:
            outcome.error += f"; destroy failed too: {cleanup}"
    return outcome


def run(backend: KubernetesBackend, n: int, concurrency: int, fleet: str) -> tuple[list[Outcome], float]:
    names = [f"{fleet}-{i}" for i in range(n)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(lambda name: one_lifecycle(backend, name, fleet), names))
    return outcomes, time.perf_counter() - started


def settle_and_count_leaks(core: k8s.CoreV1Api, kubelet: TestKubelet) -> dict[str, int]:
    """Deletions complete asynchronously (the kubelet confirms them): wait for them, then count what stays."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        leaks = {
            "pods": len(core.list_namespaced_pod(NAMESPACE).items),
            "secrets": len([s for s in core.list_namespaced_secret(NAMESPACE).items if s.type == "Opaque"]),
            "processes": kubelet.live_processes(),
        }
        if not any(leaks.values()) or time.monotonic() > deadline:
            return leaks
        time.sleep(0.5)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 2)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--baseline-n", type=int, default=20)
    args = parser.parse_args(argv)

    cluster = start_cluster()
    kubelet = TestKubelet(cluster.api_client(), namespace=NAMESPACE, max_workers=max(32, 2 * args.concurrency))
    try:
        core = k8s.CoreV1Api(cluster.api_client())
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        kubelet.start()
        figures = measure(cluster, kubelet, core, args)
    finally:
        kubelet.stop()
        cluster.destroy()
    print(json.dumps(figures))


def measure(cluster, kubelet: TestKubelet, core: k8s.CoreV1Api, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    def backend() -> KubernetesBackend:
        return KubernetesBackend(namespace=NAMESPACE, api_client=cluster.api_client(),
                                 config=KubeSandboxConfig(default_image=IMAGE))

    baseline_backend = backend()
    baseline, baseline_s = run(baseline_backend, args.baseline_n, 1, f"seq-{uuid.uuid4().hex[:6]}")
    sequential_ms = baseline_s * 1e3 / max(1, args.baseline_n)
    print(f"baseline: {args.baseline_n} lifecycles one at a time: {sequential_ms:.1f} ms each, "
          f"{sum(o.ok for o in baseline)}/{args.baseline_n} ok")

    bench = backend()
    outcomes, seconds = run(bench, args.n, args.concurrency, f"bench-{uuid.uuid4().hex[:6]}")
    leaks = settle_and_count_leaks(core, kubelet)
    ok = [o for o in outcomes if o.ok]
    per_sandbox_ms = seconds * 1e3 / max(1, args.n)
    figures = {
        "n": args.n,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 2),
        "success_rate": round(len(ok) / max(1, args.n), 4),
        "leaked": sum(leaks.values()),
        "leaked_detail": leaks,
        "api_calls_per_sandbox": round(bench.api_calls / max(1, args.n), 2),
        "api_calls_floor": API_CALLS_FLOOR,
        "api_calls_by_method": dict(sorted(bench.api_calls_by_method.items())),
        "create_p50_ms": pct([o.create_ms for o in ok], 50),
        "create_p95_ms": pct([o.create_ms for o in ok], 95),
        "exec_p50_ms": pct([o.exec_ms for o in ok], 50),
        "destroy_p50_ms": pct([o.destroy_ms for o in ok], 50),
        "sandboxes_per_s": round(args.n / seconds, 2),
        "baseline_sequential_per_sandbox_ms": round(sequential_ms, 1),
        "speedup_vs_sequential": round(sequential_ms / per_sandbox_ms, 2),
        "kubelet_errors": kubelet.errors[:5],
        "errors": [f"{o.name}: {o.error}" for o in outcomes if not o.ok][:5],
    }
    print(f"{args.n} lifecycles at concurrency {args.concurrency}: {figures['seconds']} s "
          f"({figures['sandboxes_per_s']}/s, {figures['speedup_vs_sequential']}x sequential), "
          f"success {figures['success_rate']}, leaked {figures['leaked']} {leaks}")
    print(f"create p50 {figures['create_p50_ms']} ms p95 {figures['create_p95_ms']} ms; exec p50 "
          f"{figures['exec_p50_ms']} ms; destroy p50 {figures['destroy_p50_ms']} ms; "
          f"{figures['api_calls_per_sandbox']} API calls per sandbox (floor {API_CALLS_FLOOR})")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
