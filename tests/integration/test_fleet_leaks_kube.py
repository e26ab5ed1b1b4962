"""Leak-proofing with pods: a real kube-apiserver on loopback and the test kubelet. A pod deleted behind the
reconciler's back, a pod with the fleet's label but no row, a create retried after its caller timed out.
Each case ends with no orphan (no pod, no agent secret) and no duplicate, and the events say what happened."""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (kube_pool is a fixture)
    events_of,
    kube_pool,
    make_kube_fleet,
    pods,
    transitions_of,
    wait_until,
)
from tests.webapp.rollouts.jobs_factories import Enqueued, make_endpoint, make_task_set
from webapp.fleets import services
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import Sandbox, SandboxEvent
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create, rollout_start
from workers import fleet_ops
from workers.reconciler import fleet_reconcile
from workers.sandboxes.base import SandboxError, SandboxSpec

S = Sandbox.State
pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.django_db]


@pytest.fixture
def core(kube_cluster) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_cluster.api_client())


def secrets(core: k8s.CoreV1Api, namespace: str) -> list[str]:
    return [s.metadata.name for s in core.list_namespaced_secret(namespace, label_selector="trove.dev/sandbox").items]


def settle(fleet, core, namespace: str, *, rounds: int = 20) -> None:
    """Run rounds until every terminating row's pod is gone and the rows say so."""
    for _ in range(rounds):
        fleet_reconcile(fleet=fleet)
        if not Sandbox.objects.filter(fleet=fleet, state=S.TERMINATING).exists():
            return
        time.sleep(0.5)
    pytest.fail("terminating sandboxes never finished")


def test_a_pod_deleted_behind_the_reconcilers_back_is_lost_and_its_rollout_told(
    kube_pool, core, kube_namespace, django_capture_on_commit_callbacks  # noqa: F811
):
    fleet = make_kube_fleet(min_warm=1, max_warm=1, max_total=3)
    fleet_reconcile(fleet=fleet)
    wait_until(lambda: fleet_reconcile(fleet=fleet)["adopted"] or Sandbox.objects.filter(fleet=fleet, state=S.WARM).exists(),
               what="a warm sandbox")
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:worker-1")
    job = job_create(task_set=make_task_set(["t"]), fleet=fleet, endpoint=make_endpoint(model_names=["m"]),
                     model_name="m", enqueue=Enqueued())
    rollout = rollout_start(rollout_id=job.rollouts.get().pk, worker="worker-1")
    Rollout.objects.filter(pk=rollout.pk).update(sandbox=lease.sandbox)

    core.delete_namespaced_pod(lease.sandbox.name, kube_namespace)  # kubectl delete pod, say
    wait_until(lambda: lease.sandbox.name not in pods(core, kube_namespace), what="the pod gone")
    enqueued = Enqueued()
    with django_capture_on_commit_callbacks(execute=True):
        report = fleet_reconcile(fleet=fleet, enqueue=enqueued)
    settle(fleet, core, kube_namespace)

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert report["lost"] == 1 and sandbox.state == S.TERMINATED
    assert transitions_of(sandbox)[-3:] == [S.LOST, S.TERMINATING, S.TERMINATED]
    assert ("transition", S.LOST, "backend object vanished") in events_of(sandbox)
    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.QUEUED and enqueued.ids == [rollout.pk]
    assert SandboxEvent.objects.get(sandbox=sandbox, kind="rollout_told").data["outcome"] == "requeued"
    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_exec(lease, "true")
    names = {s.name for s in Sandbox.objects.filter(fleet=fleet).exclude(state=S.TERMINATED)}
    assert set(pods(core, kube_namespace)) == names and len(names) == 1  # its replacement, nothing else
    assert set(secrets(core, kube_namespace)) == {f"{n}-agent" for n in names}


def test_a_pod_with_the_fleet_label_and_no_row_is_deleted_after_the_grace_period(kube_pool, core, kube_namespace):  # noqa: F811
    fleet = make_kube_fleet()
    kube_pool.create(SandboxSpec(name="made-by-hand", labels={"trove.dev/fleet": str(fleet.pk)}, cpu=0.1))

    seen = fleet_reconcile(fleet=fleet, orphan_grace_s=1.0)
    time.sleep(1.1)
    deleted = fleet_reconcile(fleet=fleet, orphan_grace_s=1.0)
    wait_until(lambda: not pods(core, kube_namespace), what="the orphan pod gone")

    assert (seen["orphans_seen"], deleted["orphans_deleted"]) == (1, 1)
    kinds = list(SandboxEvent.objects.filter(fleet=fleet, sandbox_name="made-by-hand").order_by("id")
                 .values_list("kind", flat=True))
    assert kinds == ["orphan_seen", "orphan_deleted"]
    assert secrets(core, kube_namespace) == []
    assert fleet_reconcile(fleet=fleet, orphan_grace_s=1.0)["orphans_seen"] == 0
    assert not Sandbox.objects.filter(fleet=fleet).exists()


def test_a_create_retried_while_the_first_is_still_pending_makes_one_pod(kube_pool, kube_kubelet, core, kube_namespace):  # noqa: F811
    fleet = make_kube_fleet(min_warm=1, max_warm=1)
    with kube_kubelet.paused():
        assert fleet_reconcile(fleet=fleet)["created"] == 1
        row = Sandbox.objects.get(fleet=fleet)
        # Its creator timed out waiting and retries (a redelivered task would do the same): same row, same name.
        fleet_ops.sandbox_create(sandbox=row, wait=False)
        kube_pool.create(fleet_ops.spec_for(row), wait=False)
        assert list(pods(core, kube_namespace)) == [row.name]
    wait_until(lambda: fleet_reconcile(fleet=fleet)["adopted"], what="the pod adopted")

    row.refresh_from_db()
    assert row.state == S.WARM and list(pods(core, kube_namespace)) == [row.name]
    assert transitions_of(row) == [S.REQUESTED, S.PROVISIONING, S.WARM]
    assert Sandbox.objects.filter(fleet=fleet).count() == 1


def test_a_create_that_timed_out_leaves_nothing_and_is_replaced_by_exactly_one(kube_pool, kube_kubelet, core, kube_namespace):  # noqa: F811
    fleet = make_kube_fleet(min_warm=1, max_warm=1)
    row = services.sandboxes_request(fleet=fleet, n=1, creator_waits=True)[0]
    with kube_kubelet.paused(), pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_create(sandbox=row, wait=True, timeout=1.0)

    settle(fleet, core, kube_namespace)
    wait_until(lambda: fleet_reconcile(fleet=fleet)["adopted"]
               or Sandbox.objects.filter(fleet=fleet, state=S.WARM).exists(), what="a replacement warm")

    assert caught.value.reason == "timeout"
    row.refresh_from_db()
    assert row.state == S.TERMINATED and transitions_of(row)[-3:] == [S.FAILED, S.TERMINATING, S.TERMINATED]
    warm = Sandbox.objects.get(fleet=fleet, state=S.WARM)
    assert list(pods(core, kube_namespace)) == [warm.name]
    assert secrets(core, kube_namespace) == [f"{warm.name}-agent"]
