"""The reconciler and the watch with the Kubernetes backend: a real kube-apiserver on loopback and the test
kubelet (pods run the real agent as local processes). Creates never block a round; observations (the next
round's list, or the watch) make pods warm; bad images and missing capacity hold the fleet."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from kubernetes import client as k8s

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (kube_pool is a fixture)
    KUBE_IMAGE,
    events_of,
    kube_pool,
    make_kube_fleet,
    make_template,
    pods,
    wait_until,
)
from webapp.fleets import services
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent
from workers import fleet_ops
from workers.reconciler import fleet_reconcile, fleet_watch

S = Sandbox.State
H = Fleet.HoldKind
pytestmark = [pytest.mark.kube, pytest.mark.django_db]


@pytest.fixture
def core(kube_cluster) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_cluster.api_client())


def backend_states(backend, fleet: Fleet) -> dict[str, str]:
    return {h.name: h.state for h in backend.list({"trove.dev/fleet": str(fleet.pk)})}


def test_a_round_creates_pods_without_waiting_and_a_later_round_makes_the_ready_ones_warm(kube_pool, kube_kubelet):  # noqa: F811
    fleet = make_kube_fleet(min_warm=2, max_warm=2, max_total=4)

    with kube_kubelet.paused():  # pods stay Pending, as during a slow image pull
        first = fleet_reconcile(fleet=fleet)
        assert first["created"] == 2
        assert set(Sandbox.objects.filter(fleet=fleet).values_list("state", flat=True)) == {S.PROVISIONING}
        assert fleet_reconcile(fleet=fleet)["created"] == 0  # provisioning ones count toward the target
    wait_until(lambda: set(backend_states(kube_pool, fleet).values()) == {"ready"}, what="pods ready")
    second = fleet_reconcile(fleet=fleet)

    assert second["adopted"] == 2 and second["created"] == 0
    warm = Sandbox.objects.filter(fleet=fleet, state=S.WARM)
    assert warm.count() == 2 and all(s.endpoint.startswith("tcp:") and s.agent_secret for s in warm)
    assert events_of(warm[0])[-1] == ("transition", S.WARM, "backend reports it ready")
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="r")
    assert fleet_ops.sandbox_exec(lease, "echo from the pod").stdout == "from the pod\n"
    fleet_ops.sandbox_release(lease)
    assert Sandbox.objects.get(pk=lease.sandbox.pk).state == S.TERMINATING  # until the pod is gone
    wait_until(lambda: lease.sandbox.name not in backend_states(kube_pool, fleet), what="the pod gone")
    fleet_reconcile(fleet=fleet)
    assert Sandbox.objects.get(pk=lease.sandbox.pk).state == S.TERMINATED


@pytest.mark.django_db(transaction=True)
def test_the_watch_makes_a_pod_warm_as_soon_as_it_is_ready(kube_pool, kube_kubelet):  # noqa: F811
    fleet = make_kube_fleet(min_warm=1, max_warm=1)
    stop = threading.Event()

    def watch() -> None:
        try:
            fleet_watch(stop_event=stop)
        finally:
            connection.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        assert fleet_reconcile(fleet=fleet)["created"] == 1
        sandbox = wait_until(lambda: Sandbox.objects.filter(fleet=fleet, state=S.WARM).first(),
                             what="the watch to make the sandbox warm")  # no second round
    finally:
        stop.set()
        thread.join(timeout=15)
    assert sandbox.agent_secret and sandbox.endpoint.startswith("tcp:")
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="r")
    assert fleet_ops.sandbox_exec(lease, "true").exit_code == 0
    fleet_ops.sandbox_release(lease)


def test_an_unpullable_image_holds_the_fleet_instead_of_churning(kube_pool, core, kube_namespace):  # noqa: F811
    fleet = make_kube_fleet(image="registry.trove.invalid/sandbox@sha256:" + "1" * 64, min_warm=2, max_warm=2)

    fleet_reconcile(fleet=fleet)
    wait_until(lambda: set(backend_states(kube_pool, fleet).values()) == {"failed"}, what="image pull failure")
    observed = fleet_reconcile(fleet=fleet)
    later = [fleet_reconcile(fleet=fleet) for _ in range(2)]

    fleet.refresh_from_db()
    assert observed["failed"] == 2 and observed["created"] == 0
    assert (fleet.status, fleet.hold_kind, fleet.hold_until) == (Fleet.Status.HOLDING, H.PERMANENT, None)
    assert "ErrImagePull" in fleet.hold_reason or "ImagePullBackOff" in fleet.hold_reason
    assert all(r["created"] == 0 for r in later)
    assert Sandbox.objects.filter(fleet=fleet).count() == 2
    wait_until(lambda: not pods(core, kube_namespace), what="failed pods cleaned up")
    fleet_reconcile(fleet=fleet)
    assert set(Sandbox.objects.filter(fleet=fleet).values_list("state", flat=True)) == {S.TERMINATED}


def test_pods_that_do_not_fit_hold_the_fleet_for_capacity_with_the_schedulers_reason(kube_pool):  # noqa: F811
    fleet = make_kube_fleet(cpu=500, min_warm=2, max_warm=3, max_total=6)

    fleet_reconcile(fleet=fleet)
    wait_until(lambda: all(h.reason == "Unschedulable" for h in kube_pool.list({"trove.dev/fleet": str(fleet.pk)}))
               and len(backend_states(kube_pool, fleet)) == 2, what="the pods to be found unschedulable")
    reports = [fleet_reconcile(fleet=fleet) for _ in range(3)]

    fleet.refresh_from_db()
    assert (fleet.status, fleet.hold_kind) == (Fleet.Status.HOLDING, H.CAPACITY)
    assert "Insufficient cpu" in fleet.hold_reason
    assert all(r["created"] == 0 for r in reports)
    pending = Sandbox.objects.filter(fleet=fleet)
    assert pending.count() == 2 and all(s.backend_reason.startswith("Unschedulable") for s in pending)
    services.fleet_drain(fleet=fleet)
    fleet_reconcile(fleet=fleet)


def test_a_template_with_a_network_mode_kubernetes_cannot_enforce_is_held(kube_pool):  # noqa: F811
    fleet = make_kube_fleet(template=make_template(image=KUBE_IMAGE, network="allow-list"), min_warm=1)

    report = fleet_reconcile(fleet=fleet)

    fleet.refresh_from_db()
    assert report["created"] == 0 and fleet.hold_kind == H.PERMANENT and "network policy" in fleet.hold_reason
    assert not Sandbox.objects.filter(fleet=fleet).exists()


def _set_quota(core: k8s.CoreV1Api, namespace: str, *, hard: int, used: int) -> None:
    """A ResourceQuota on pods. No quota controller runs here, so its usage is written by hand, as the
    controller would; the API server's admission then enforces it for real."""
    body = {"metadata": {"name": "sandboxes"}, "spec": {"hard": {"pods": str(hard)}}}
    try:
        core.create_namespaced_resource_quota(namespace, body)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_resource_quota("sandboxes", namespace, body)
    status = {**body, "status": {"hard": {"pods": str(hard)}, "used": {"pods": str(used)}}}
    core.replace_namespaced_resource_quota_status("sandboxes", namespace, status)


def test_an_exceeded_quota_holds_with_a_back_off_and_a_probe_resumes_once_there_is_room(
        kube_pool, core, kube_namespace):  # noqa: F811
    fleet = make_kube_fleet(min_warm=2, max_warm=2, max_total=4)
    _set_quota(core, kube_namespace, hard=1, used=1)

    refused = fleet_reconcile(fleet=fleet)
    held = fleet_reconcile(fleet=fleet)

    fleet.refresh_from_db()
    assert (refused["create_failed"], held["created"] + held["create_failed"]) == (2, 0)
    assert (fleet.status, fleet.hold_kind) == (Fleet.Status.HOLDING, H.QUOTA) and "exceeded quota" in fleet.hold_reason
    assert fleet.hold_until is not None and not pods(core, kube_namespace)
    _set_quota(core, kube_namespace, hard=10, used=0)
    Fleet.objects.filter(pk=fleet.pk).update(hold_until=fleet.held_at)  # as if the back-off had passed

    probe = fleet_reconcile(fleet=fleet)
    wait_until(lambda: fleet_reconcile(fleet=fleet)["adopted"], what="the probe adopted")  # and the rest made
    fleet.refresh_from_db()

    assert probe["created"] == 1 and fleet.status == Fleet.Status.ACTIVE
    live = Sandbox.objects.filter(fleet=fleet).exclude(state=S.TERMINATED)
    assert live.count() == 2 and set(pods(core, kube_namespace)) == set(live.values_list("name", flat=True))
    assert list(SandboxEvent.objects.filter(fleet=fleet, sandbox=None).order_by("id").values_list("kind", flat=True)) == [
        "hold", "unhold"]
