"""Fleet operations against real bubblewrap sandboxes: provision, claim warm / wait / cold, exec with fencing,
release, setup commands, and the events each leaves."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (pool_backend is a fixture)
    events_of,
    make_fleet,
    make_template,
    pool_backend,
    transitions_of,
)
from webapp.fleets import services
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent
from workers import fleet_ops
from workers.sandboxes.base import SandboxError

S = Sandbox.State
pytestmark = pytest.mark.django_db


def test_a_provisioned_sandbox_is_warm_with_its_phases_stamped(pool_backend):  # noqa: F811
    fleet = make_fleet()

    sandbox = fleet_ops.sandbox_provision(fleet=fleet)

    sandbox.refresh_from_db()
    assert sandbox.state == S.WARM and sandbox.endpoint.startswith("unix:") and sandbox.agent_secret
    assert sandbox.requested_at <= sandbox.scheduled_at <= sandbox.ready_at
    assert transitions_of(sandbox) == [S.REQUESTED, S.PROVISIONING, S.WARM]
    assert [h.name for h in pool_backend.list({"trove.dev/fleet": str(fleet.pk)})] == [sandbox.name]


def test_a_warm_claim_then_execs_are_fenced_logged_and_the_release_leaves_nothing(pool_backend):  # noqa: F811
    fleet = make_fleet()
    fleet_ops.sandbox_provision(fleet=fleet)

    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:7")
    first = fleet_ops.sandbox_exec(lease, "echo hi > out.txt; cat out.txt", reason="harness")
    fleet_ops.sandbox_write_files(lease, {"notes/a.txt": "hello\n"})
    second = fleet_ops.sandbox_exec(lease, "cat notes/a.txt; exit 3", reason="eval")
    fleet_ops.sandbox_release(lease)

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert (first.stdout, first.exit_code, second.stdout, second.exit_code) == ("hi\n", 0, "hello\n", 3)
    assert sandbox.state == S.TERMINATED and sandbox.leased_at <= sandbox.first_exec_at <= sandbox.terminated_at
    assert pool_backend.list({}) == []
    kinds = [(kind, to or reason) for kind, to, reason in events_of(sandbox)]
    assert kinds[-7:] == [
        ("transition", S.LEASED), ("exec", "harness"), ("write_files", "1 file(s)"), ("exec", "eval"),
        ("transition", S.RELEASED), ("transition", S.TERMINATING), ("transition", S.TERMINATED),
    ]
    execs = list(SandboxEvent.objects.filter(sandbox=sandbox, kind="exec").order_by("id").values_list("data", flat=True))
    assert [(e["exit_code"], e["fencing_token"]) for e in execs] == [(0, 1), (3, 1)]
    fleet.refresh_from_db()
    assert (fleet.claims_hit, fleet.claims_miss) == (1, 0)


def test_an_exec_with_a_superseded_lease_is_refused_before_it_reaches_the_sandbox(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(reusable=True))
    fleet_ops.sandbox_provision(fleet=fleet)
    old = fleet_ops.sandbox_claim(fleet=fleet, holder="slow-worker")
    fleet_ops.sandbox_release(old)  # a reusable sandbox goes back to the pool ...
    new = fleet_ops.sandbox_claim(fleet=fleet, holder="next-worker")  # ... and is leased again
    assert new.sandbox.pk == old.sandbox.pk and new.fencing_token == old.fencing_token + 1

    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_exec(old, "touch written-by-the-stale-holder")
    fleet_ops.sandbox_release(old)  # a stale release releases nothing

    assert fleet_ops.sandbox_exec(new, "ls").stdout == ""  # the stale command never ran
    assert Sandbox.objects.get(pk=new.sandbox.pk).state == S.LEASED
    assert SandboxEvent.objects.filter(sandbox=new.sandbox, kind="fence_refused").count() == 1
    fleet_ops.sandbox_release(new)


def test_a_miss_under_the_cold_policy_creates_one_on_demand_and_counts_the_miss(pool_backend):  # noqa: F811
    fleet = make_fleet(miss_policy=Fleet.MissPolicy.COLD)

    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:1")

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert sandbox.state == S.LEASED and sandbox.cold_claim and lease.fencing_token == 1
    # Straight from provisioning to leased: never warm, so no other claimer could have taken it.
    assert transitions_of(sandbox) == [S.REQUESTED, S.PROVISIONING, S.LEASED]
    assert SandboxEvent.objects.get(sandbox=sandbox, to_state=S.LEASED).data["claim"] == "cold"
    assert fleet_ops.sandbox_exec(lease, "echo cold").stdout == "cold\n"
    fleet.refresh_from_db()
    assert (fleet.claims_hit, fleet.claims_miss) == (0, 1)
    fleet_ops.sandbox_release(lease)


@pytest.mark.django_db(transaction=True)
def test_a_miss_under_the_wait_policy_takes_the_refill_that_arrives_meanwhile(pool_backend):  # noqa: F811
    fleet = make_fleet(miss_policy=Fleet.MissPolicy.WAIT)

    def refill() -> None:
        try:
            fleet_ops.sandbox_provision(fleet=fleet)
        finally:
            connection.close()

    threading.Timer(0.3, refill).start()
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="patient", wait_s=20)

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert not sandbox.cold_claim and transitions_of(sandbox)[-2:] == [S.WARM, S.LEASED]
    assert SandboxEvent.objects.get(sandbox=sandbox, to_state=S.LEASED).data["claim"] == "waited"
    assert Sandbox.objects.filter(fleet=fleet).count() == 1  # no cold one was made
    fleet.refresh_from_db()
    assert (fleet.claims_hit, fleet.claims_miss) == (0, 1)
    fleet_ops.sandbox_release(lease)


def test_a_cold_claim_on_a_full_fleet_is_refused_as_transient(pool_backend):  # noqa: F811
    fleet = make_fleet(max_warm=1, max_total=1)
    busy = fleet_ops.sandbox_claim(fleet=fleet, holder="first")

    with pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_claim(fleet=fleet, holder="second")

    assert caught.value.reason == "fleet_full" and not caught.value.permanent
    assert Sandbox.objects.filter(fleet=fleet).count() == 1
    fleet_ops.sandbox_release(busy)


def test_a_draining_fleet_creates_nothing_on_a_miss(pool_backend):  # noqa: F811
    fleet = make_fleet()
    services.fleet_drain(fleet=fleet)
    with pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_claim(fleet=fleet, holder="late")
    assert caught.value.reason == "fleet_draining"
    assert not Sandbox.objects.filter(fleet=fleet).exists()


@pytest.mark.parametrize(("kind", "permanent"), [(Fleet.HoldKind.PERMANENT, True), (Fleet.HoldKind.CAPACITY, False)])
def test_a_held_fleet_refuses_a_cold_create_as_permanently_as_it_holds(pool_backend, kind, permanent):  # noqa: F811
    fleet = make_fleet()
    services.fleet_hold(fleet=fleet, kind=kind, reason="image pull failed", retry_in_s=None if permanent else 30)

    with pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_claim(fleet=fleet, holder="r")

    assert (caught.value.reason, caught.value.permanent) == ("fleet_holding", permanent)
    assert "image pull failed" in str(caught.value)
    assert not Sandbox.objects.filter(fleet=fleet).exists()


def test_setup_commands_run_once_before_the_sandbox_is_warm(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(setup_commands=["echo ready > setup.txt", "mkdir -p cache"]))

    sandbox = fleet_ops.sandbox_provision(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="r")

    assert fleet_ops.sandbox_exec(lease, "cat setup.txt; ls -d cache").stdout == "ready\ncache\n"
    setup = SandboxEvent.objects.filter(sandbox=sandbox, kind="exec", reason="template setup")
    assert setup.count() == 2
    assert SandboxEvent.objects.filter(sandbox=sandbox, kind="exec").order_by("id").first().reason == "template setup"
    fleet_ops.sandbox_release(lease)


def test_a_failing_setup_command_fails_the_sandbox_permanently_and_cleans_it_up(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(setup_commands=["exit 4"]))

    with pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_provision(fleet=fleet)

    assert caught.value.permanent and caught.value.reason == "setup_failed"
    sandbox = Sandbox.objects.get(fleet=fleet)
    assert sandbox.state == S.TERMINATED and "setup command failed (exit 4)" in sandbox.failure_reason
    assert transitions_of(sandbox) == [S.REQUESTED, S.PROVISIONING, S.FAILED, S.TERMINATING, S.TERMINATED]
    assert pool_backend.list({}) == []


def test_a_create_the_backend_refuses_is_failed_with_its_reason(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(rootfs="/nonexistent/rootfs"))

    with pytest.raises(SandboxError) as caught:
        fleet_ops.sandbox_provision(fleet=fleet)

    sandbox = Sandbox.objects.get(fleet=fleet)
    failed = SandboxEvent.objects.get(sandbox=sandbox, to_state=S.FAILED)
    assert caught.value.reason == "bad_rootfs" and failed.data == {"reason": "bad_rootfs", "permanent": True}
    assert sandbox.state == S.TERMINATED and pool_backend.list({}) == []


def test_an_exec_the_agent_cannot_run_is_logged_as_such(pool_backend):  # noqa: F811
    fleet = make_fleet()
    fleet_ops.sandbox_provision(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="r")
    pool_backend.destroy(lease.sandbox.name)  # gone behind the lease's back

    with pytest.raises(SandboxError):
        fleet_ops.sandbox_exec(lease, "true", reason="harness")

    failed = SandboxEvent.objects.get(sandbox=lease.sandbox, kind="exec_failed")
    assert failed.reason == "harness" and failed.data["exit_code"] is None and failed.data["error"]
