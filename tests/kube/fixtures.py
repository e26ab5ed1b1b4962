"""pytest plugin: a real kube-apiserver (plus etcd) on loopback for the test session, and a test kubelet.

Register with `pytest_plugins = ["tests.kube.fixtures"]` in tests/conftest.py. Fixtures:
- `kube_cluster` (session): a started `LoopbackCluster`: `.api_client(token=None)`, `.kubeconfig`, `.token`,
  `.url`, `.user(name)`. Its token file also holds `BACKEND_USER`, the user name of the ServiceAccount
  that deploy/sandbox-rbac.yaml binds, so a test can act with exactly that Role's rights.
- `kube_kubelet` (session): a running `TestKubelet` serving every namespace.
- `kube_namespace` (function): a fresh namespace name; its pods are deleted afterwards, and the test fails
  if the kubelet hit an unexpected error on one of them. (Namespaces themselves cannot go away here: that
  needs the namespace controller, which does not run.)

Tests are skipped only when no kube-apiserver binary can be provided at all (neither the prebuilt one
nor a source build); every other failure to start is an error.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.kube.cluster import (
    BACKEND_SERVICE_ACCOUNT,
    CONTROL_NAMESPACE,
    ApiserverUnavailable,
    LoopbackCluster,
    service_account_user,
    start_cluster,
)
from tests.kube.kubelet import TestKubelet

BACKEND_USER = f"system:serviceaccount:{CONTROL_NAMESPACE}:{BACKEND_SERVICE_ACCOUNT}"
_APISERVER_MISSING: list[str] = []  # why the kube tests were skipped, said again at the end of the run


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[LoopbackCluster]:
    workdir = Path(tempfile.mkdtemp(prefix="trove-kube-"))
    try:
        cluster = start_cluster(workdir, extra_users=[service_account_user(CONTROL_NAMESPACE, BACKEND_SERVICE_ACCOUNT)])
    except ApiserverUnavailable as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        _APISERVER_MISSING.append(str(exc))
        pytest.skip(
            "!!! NO KUBE-APISERVER: Kubernetes tests skipped. Provide one with scripts/kube/ensure_apiserver.sh "
            f"(TROVE_KUBE_APISERVER_XZ, or a source build). Cause: {exc}"
        )
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def kube_kubelet(kube_cluster: LoopbackCluster) -> Iterator[TestKubelet]:
    kubelet = TestKubelet(kube_cluster.api_client()).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture
def kube_namespace(kube_cluster: LoopbackCluster, kube_kubelet: TestKubelet) -> Iterator[str]:
    core = k8s.CoreV1Api(kube_cluster.api_client())
    name = f"t-{secrets.token_hex(4)}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    # The kubelet runs in threads, where an exception would pass unseen: fail the test that caused one.
    errors = [e for e in kube_kubelet.errors if f" {name}/" in e]
    assert not errors, f"test kubelet errors: {errors}"


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll until `predicate()` is truthy and return its value; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pytest_terminal_summary(terminalreporter) -> None:
    """A skipped Kubernetes suite must not pass unnoticed among the dots: say it in the run's summary."""
    if not _APISERVER_MISSING:
        return
    terminalreporter.section("KUBERNETES TESTS SKIPPED: no kube-apiserver", sep="!", red=True, bold=True)
    terminalreporter.line("Every test that needs the loopback kube-apiserver was skipped. Provide one with "
                          "scripts/kube/ensure_apiserver.sh (TROVE_SHARED_DIR or TROVE_KUBE_APISERVER_XZ).", red=True)
    terminalreporter.line(f"cause: {_APISERVER_MISSING[0][:500]}", red=True)
