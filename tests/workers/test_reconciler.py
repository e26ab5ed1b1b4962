"""The reconciler with the local backend (real bubblewrap): topping up through the rate limiter and max_total,
sizing from the backlog, reaping, draining, rolling replacement, holds instead of churn, and two
reconcilers at once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (pool_backend is a fixture)
    events_of,
    make_fleet,
    make_template,
    pool_backend,
)
from tests.webapp.rollouts.jobs_factories import Enqueued, make_endpoint, make_task_set
from webapp.fleets import services
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create, rollout_start
from workers import fleet_ops, reconciler
from workers.reconciler import fleet_lock, fleet_reconcile, warm_target

S = Sandbox.State
H = Fleet.HoldKind
pytestmark = pytest.mark.django_db


def states(fleet: Fleet) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Sandbox.objects.filter(fleet=fleet).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


def listed(backend, fleet: Fleet) -> set[str]:
    return {h.name for h in backend.list({"trove.dev/fleet": str(fleet.pk)})}


def test_it_tops_a_fixed_fleet_up_to_min_warm_and_then_leaves_it_alone(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=3, max_warm=4, max_total=8)

    first = fleet_reconcile(fleet=fleet)
    second = fleet_reconcile(fleet=fleet)

    assert (first["created"], first["warm_target"], second["created"]) == (3, 3, 0)
    assert states(fleet) == {S.WARM: 3}
    assert listed(pool_backend, fleet) == set(Sandbox.objects.filter(fleet=fleet).values_list("name", flat=True))
    fleet.refresh_from_db()
    assert fleet.reconciled_at is not None and fleet.last_report["created"] == 0


def test_backlog_sizing_follows_the_rollouts_about_to_claim_within_min_and_max_warm():
    fleet = make_fleet(sizing=Fleet.Sizing.BACKLOG, min_warm=1, max_warm=5, max_total=10)
    assert warm_target(fleet) == 1
    job = job_create(task_set=make_task_set(["a", "b", "c"]), fleet=fleet, endpoint=make_endpoint(model_names=["m"]),
                     model_name="m", samples_per_task=3, concurrency=9, enqueue=Enqueued())
    assert job.rollouts.count() == 9
    assert warm_target(fleet) == 5  # 9 queued, capped at max_warm

    for rollout in job.rollouts.all()[:6]:
        rollout_start(rollout_id=rollout.pk, worker="w")  # running, no sandbox yet: still about to claim
    Rollout.objects.filter(job=job, status=Rollout.Status.RUNNING)[:1].get()
    assert warm_target(fleet) == 5
    running = list(Rollout.objects.filter(job=job, status=Rollout.Status.RUNNING).values_list("pk", flat=True))
    Rollout.objects.filter(pk__in=running).update(status=Rollout.Status.SUCCEEDED)
    assert warm_target(fleet) == 3  # the 3 still queued
    services.fleet_drain(fleet=fleet)
    fleet.refresh_from_db()
    assert warm_target(fleet) == 0


def test_the_rate_limiter_spreads_a_big_top_up_over_time(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=5, max_warm=5, max_total=10, refill_per_minute=2)

    first = fleet_reconcile(fleet=fleet)
    second = fleet_reconcile(fleet=fleet)

    assert (first["created"], second["created"]) == (2, 0)
    assert any("rate limited" in note for note in second["notes"])
    assert states(fleet) == {S.WARM: 2}


def test_at_max_total_it_holds_with_the_reason_and_resumes_when_room_appears(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=2, max_warm=2, max_total=2)
    fleet_reconcile(fleet=fleet)
    leases = [fleet_ops.sandbox_claim(fleet=fleet, holder=f"r{i}") for i in range(2)]

    report = fleet_reconcile(fleet=fleet)

    fleet.refresh_from_db()
    assert report["created"] == 0 and report["hold"] == "at max_total (2): 2 warm sandbox(es) short"
    assert (fleet.status, fleet.hold_kind) == (Fleet.Status.HOLDING, H.MAX_TOTAL)
    fleet_ops.sandbox_release(leases[0])
    report = fleet_reconcile(fleet=fleet)
    fleet.refresh_from_db()
    assert report["created"] == 1 and fleet.status == Fleet.Status.ACTIVE and fleet.hold_reason == ""
    assert list(SandboxEvent.objects.filter(fleet=fleet, sandbox=None).values_list("kind", flat=True)) == [
        "unhold", "hold"]
    fleet_ops.sandbox_release(leases[1])


def test_a_terminating_sandbox_still_occupies_capacity_until_it_is_gone(pool_backend, monkeypatch):  # noqa: F811
    fleet = make_fleet(min_warm=2, max_warm=2, max_total=2)
    fleet_reconcile(fleet=fleet)
    stuck = Sandbox.objects.filter(fleet=fleet).first()
    # A destroy that failed half-way leaves the row terminating and its object in place.
    services.sandbox_transition(sandbox=stuck, to=S.TERMINATING, expect=(S.WARM,), reason="destroy failed")

    held = fleet_reconcile(fleet=fleet)
    monkeypatch.setattr(reconciler, "TERMINATING_RETRY_S", 0.0)
    retried = fleet_reconcile(fleet=fleet)

    assert held["created"] == 0 and "at max_total" in held["hold"]
    stuck.refresh_from_db()
    assert stuck.state == S.TERMINATED and stuck.name not in listed(pool_backend, fleet)
    assert retried["created"] == 1 and states(fleet) == {S.WARM: 2, S.TERMINATED: 1}


def test_an_expired_lease_is_reclaimed_and_its_sandbox_destroyed(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=1, max_warm=1, max_total=2)
    fleet_reconcile(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:9:dead-worker", lease_seconds=0)
    time.sleep(0.05)

    report = fleet_reconcile(fleet=fleet)

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert report["reaped"] == 1 and sandbox.state == S.TERMINATED
    assert ("transition", S.TERMINATING, "lease of rollout:9:dead-worker expired") in events_of(sandbox)
    assert sandbox.name not in listed(pool_backend, fleet)
    assert states(fleet) == {S.TERMINATED: 1, S.WARM: 1}  # and the pool was topped up again


def test_a_lease_kept_alive_by_heartbeats_is_not_reclaimed(pool_backend):  # noqa: F811
    fleet = make_fleet()
    fleet_ops.sandbox_provision(fleet=fleet)
    # A lease that is already past its expiry (lease_seconds=0: the test above reaps exactly this), renewed by
    # a heartbeat before the reconciler comes round: time is driven by the lease itself, not by sleeping.
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="alive", lease_seconds=0)
    assert services.sandbox_heartbeat(sandbox_id=lease.sandbox.pk, fencing_token=lease.fencing_token,
                                      lease_seconds=60)

    assert fleet_reconcile(fleet=fleet)["reaped"] == 0
    assert fleet_ops.sandbox_exec(lease, "echo still mine").stdout == "still mine\n"
    fleet_ops.sandbox_release(lease)


@pytest.mark.parametrize(("template_fields", "reason"), [
    ({"idle_timeout_s": 1}, "idle for more than 1 s"),
    ({"max_lifetime_s": 1}, "over max lifetime (1 s)"),
])
def test_idle_and_over_lifetime_sandboxes_are_reaped(pool_backend, template_fields, reason):  # noqa: F811
    fleet = make_fleet(template=make_template(**template_fields))
    sandbox = fleet_ops.sandbox_provision(fleet=fleet)
    time.sleep(1.2)

    report = fleet_reconcile(fleet=fleet)

    sandbox.refresh_from_db()
    assert report["reaped"] == 1 and sandbox.state == S.TERMINATED
    assert ("transition", S.TERMINATING, reason) in events_of(sandbox)
    assert pool_backend.list({}) == []


def test_draining_retires_the_warm_pool_keeps_leases_and_creates_nothing(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=3, max_warm=3, max_total=6)
    fleet_reconcile(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="busy")
    services.fleet_drain(fleet=fleet)

    report = fleet_reconcile(fleet=fleet)
    again = fleet_reconcile(fleet=fleet)

    assert (report["retired"], report["created"], again["created"]) == (2, 0, 0)
    assert states(fleet) == {S.LEASED: 1, S.TERMINATED: 2}
    assert fleet_ops.sandbox_exec(lease, "true").exit_code == 0
    fleet_ops.sandbox_release(lease)
    assert pool_backend.list({}) == []


def test_a_new_template_version_replaces_the_warm_pool_without_dropping_below_target(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=2, max_warm=2, max_total=3)
    fleet_reconcile(fleet=fleet)
    old = set(Sandbox.objects.filter(fleet=fleet).values_list("name", flat=True))
    v2 = services.template_revise(template=fleet.template, pids=128)
    services.fleet_set_template(fleet=fleet, template=v2)
    fleet.refresh_from_db()

    warm_after_each_round = []
    for _ in range(4):
        fleet_reconcile(fleet=fleet)
        warm_after_each_round.append(Sandbox.objects.filter(fleet=fleet, state=S.WARM).count())

    warm = Sandbox.objects.filter(fleet=fleet, state=S.WARM)
    assert set(warm.values_list("spec_hash", flat=True)) == {v2.spec_hash}
    assert warm.count() == 2 and old.isdisjoint(warm.values_list("name", flat=True))
    assert min(warm_after_each_round) >= 2  # rolling: never fewer warm than the target
    assert all(f"fleet moved to {v2}" in reason for reason in SandboxEvent.objects.filter(
        fleet=fleet, to_state=S.TERMINATING).values_list("reason", flat=True))
    assert listed(pool_backend, fleet) == set(warm.values_list("name", flat=True))


def test_a_permanent_create_error_holds_the_fleet_instead_of_churning(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(rootfs="/nonexistent/rootfs"), min_warm=2, max_warm=2)

    reports = [fleet_reconcile(fleet=fleet) for _ in range(3)]

    fleet.refresh_from_db()
    assert (fleet.status, fleet.hold_kind, fleet.hold_until) == (Fleet.Status.HOLDING, H.PERMANENT, None)
    assert "bad_rootfs" in fleet.hold_reason and reports[-1]["hold"] == fleet.hold_reason
    assert Sandbox.objects.filter(fleet=fleet).count() == 2  # the first round's two, then nothing
    assert [r["created"] + r["create_failed"] for r in reports] == [2, 0, 0]
    assert pool_backend.list({}) == []

    services.fleet_set_template(fleet=fleet, template=services.template_revise(template=fleet.template, rootfs=""))
    fleet.refresh_from_db()
    report = fleet_reconcile(fleet=fleet)
    fleet.refresh_from_db()
    assert report["created"] == 2 and fleet.status == Fleet.Status.ACTIVE


def test_creates_that_keep_failing_hold_with_a_back_off_then_probe_once(pool_backend):  # noqa: F811
    # Sandboxes that cannot come up in time: each create times out, a transient error.
    fleet = make_fleet(min_warm=3, max_warm=3, max_total=6, provision_timeout_s=0)

    first = fleet_reconcile(fleet=fleet)
    fleet.refresh_from_db()
    held_round = fleet_reconcile(fleet=fleet)
    Fleet.objects.filter(pk=fleet.pk).update(hold_until=fleet.held_at)  # as if the back-off had passed
    probe = fleet_reconcile(fleet=fleet)

    assert (first["create_failed"], fleet.status, fleet.hold_kind) == (3, Fleet.Status.HOLDING, H.FAILURES)
    assert "timeout" in fleet.hold_reason and fleet.hold_until is not None
    assert held_round["created"] + held_round["create_failed"] == 0
    assert probe["created"] + probe["create_failed"] == 1
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.HOLDING and fleet.hold_until > fleet.held_at
    assert pool_backend.list({}) == []


@pytest.mark.django_db(transaction=True)
def test_a_round_skips_a_fleet_another_reconciler_holds(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=2, max_warm=2)
    result = {}

    def other_reconciler() -> None:
        try:
            result.update(fleet_reconcile(fleet_id=fleet.pk))
        finally:
            connection.close()

    with fleet_lock(fleet.pk) as held:
        thread = threading.Thread(target=other_reconciler)
        thread.start()
        thread.join()
    assert held and result["skipped"] and not Sandbox.objects.filter(fleet=fleet).exists()
    assert fleet_reconcile(fleet_id=fleet.pk)["created"] == 2


@pytest.mark.django_db(transaction=True)
def test_two_reconcilers_at_once_never_overshoot(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=4, max_warm=4, max_total=8)
    barrier = threading.Barrier(3)

    def run() -> None:
        try:
            barrier.wait()
            for _ in range(2):
                fleet_reconcile(fleet_id=fleet.pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert states(fleet) == {S.WARM: 4}
    assert len(listed(pool_backend, fleet)) == 4


def test_the_beat_task_reconciles_every_fleet_and_one_broken_fleet_does_not_stop_the_others(pool_backend, settings):  # noqa: F811
    from workers.sandboxes import registry
    from workers.tasks.fleets import reconcile_all

    broken = make_fleet(name="a-no-cluster", backend=Fleet.Backend.KUBERNETES, min_warm=1)
    healthy = make_fleet(name="b-local", min_warm=1)
    settings.TROVE_KUBECONFIG = "/nonexistent/kubeconfig"  # a cluster this process cannot reach
    registry._backends.pop("kubernetes", None)

    reports = reconcile_all()

    assert "error" in reports["a-no-cluster"] and reports["b-local"]["created"] == 1
    assert states(healthy) == {S.WARM: 1} and not Sandbox.objects.filter(fleet=broken).exists()
