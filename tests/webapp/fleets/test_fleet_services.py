"""The fleet control plane in the database: template versions, sizing, holds, claims with SKIP LOCKED, leases
and fencing tokens, heartbeats, and the event log. Real Postgres; threads for the concurrency cases."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from experience.errors import Conflict, ValidationError
from tests.webapp.fleets.fleet_factories import (
    events_of,
    make_fleet,
    make_template,
    transitions_of,
    warm_rows,
)
from webapp.fleets import services
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import EnvironmentTemplate, Fleet, Sandbox, SandboxEvent

S = Sandbox.State


@pytest.mark.django_db
def test_editing_a_template_makes_a_new_version_and_leaves_the_old_one_as_it_was():
    v1 = make_template(name="py", cpu=1.0, setup_commands=["pip --version"])

    v2 = services.template_revise(template=v1, cpu=2.0)

    v1.refresh_from_db()
    assert (v1.version, v1.cpu, v2.version, v2.cpu, v2.name) == (1, 1.0, 2, 2.0, "py")
    assert v2.setup_commands == ["pip --version"]  # everything not changed is carried over
    assert v1.spec_hash != v2.spec_hash
    assert services.template_revise(template=v1, memory_mb=v2.memory_mb).version == 3  # from the newest


@pytest.mark.django_db
def test_a_template_row_refuses_to_be_changed_in_place():
    template = make_template()
    template.cpu = 8.0
    with pytest.raises(Conflict):
        template.save()
    assert EnvironmentTemplate.objects.get(pk=template.pk).cpu == 1.0


@pytest.mark.django_db
def test_the_spec_hash_follows_the_spec_not_the_name_or_version():
    a = make_template(name="a", cpu=0.5)
    b = make_template(name="b", cpu=0.5)
    assert a.spec_hash == b.spec_hash
    assert services.template_revise(template=a, pids=64).spec_hash != a.spec_hash


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "field"), [
    ({"network": "open"}, "network"), ({"cpu": 0}, "cpu"), ({"setup_commands": "ls"}, "setup_commands"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_template_is_refused_naming_the_field(fields, field):
    with pytest.raises(ValidationError) as caught:
        make_template(**fields)
    assert caught.value.field == field
    assert not EnvironmentTemplate.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("sizes", "field"), [
    ({"min_warm": 5, "max_warm": 4}, "min_warm"), ({"max_warm": 20, "max_total": 10}, "max_warm"),
    ({"refill_per_minute": 0}, "refill_per_minute"),
])
def test_inconsistent_sizes_are_refused(sizes, field):
    fleet = make_fleet(min_warm=1, max_warm=4, max_total=8)
    with pytest.raises(ValidationError) as caught:
        services.fleet_scale(fleet=fleet, **sizes)
    assert caught.value.field == field
    fleet.refresh_from_db()
    assert (fleet.min_warm, fleet.max_warm, fleet.max_total) == (1, 4, 8)


@pytest.mark.django_db
def test_scaling_a_drained_or_held_fleet_resumes_it_and_is_logged():
    fleet = make_fleet()
    services.fleet_drain(fleet=fleet)
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.DRAINING

    services.fleet_scale(fleet=fleet, min_warm=2, max_warm=3)

    fleet.refresh_from_db()
    assert (fleet.status, fleet.min_warm, fleet.max_warm) == (Fleet.Status.ACTIVE, 2, 3)
    services.fleet_hold(fleet=fleet, kind=Fleet.HoldKind.PERMANENT, reason="bad image", retry_in_s=None)
    services.fleet_scale(fleet=fleet, max_total=20)
    fleet.refresh_from_db()
    assert (fleet.status, fleet.hold_kind, fleet.hold_reason) == (Fleet.Status.ACTIVE, "", "")
    kinds = list(SandboxEvent.objects.filter(fleet=fleet).order_by("id").values_list("kind", flat=True))
    assert kinds == ["drain", "scaled", "hold", "scaled"]


@pytest.mark.django_db
def test_a_repeated_hold_with_the_same_reason_is_logged_once():
    fleet = make_fleet()
    for _ in range(3):
        services.fleet_hold(fleet=fleet, kind=Fleet.HoldKind.QUOTA, reason="quota exceeded", retry_in_s=30)
    services.fleet_hold(fleet=fleet, kind=Fleet.HoldKind.QUOTA, reason="quota exceeded again", retry_in_s=60)
    assert SandboxEvent.objects.filter(fleet=fleet, kind="hold").count() == 2
    fleet.refresh_from_db()
    assert fleet.status == Fleet.Status.HOLDING and fleet.hold_until > timezone.now()


@pytest.mark.django_db
def test_requests_never_go_past_max_total_and_names_follow_the_row():
    fleet = make_fleet(max_warm=2, max_total=3)
    first = services.sandboxes_request(fleet=fleet, n=2)
    more = services.sandboxes_request(fleet=fleet, n=5)
    assert len(first) == 2 and len(more) == 1
    assert [s.name for s in first + more] == [f"trove-{fleet.pk}-{s.pk}" for s in first + more]
    assert all(s.spec_hash == fleet.template.spec_hash and s.template == fleet.template for s in first + more)


@pytest.mark.django_db
def test_a_warm_claim_leases_the_oldest_warm_sandbox_with_a_new_fencing_token():
    fleet = make_fleet(max_total=4)
    oldest, newer = warm_rows(fleet, 2)

    claimed = services.sandbox_claim_warm(fleet=fleet, holder="rollout:1", lease_seconds=60, started=0.0)

    assert claimed.pk == oldest.pk
    claimed.refresh_from_db()
    assert (claimed.state, claimed.lease_holder, claimed.fencing_token) == (S.LEASED, "rollout:1", 1)
    assert claimed.lease_expires_at > timezone.now() + timedelta(seconds=50)
    lease = SandboxEvent.objects.get(sandbox=claimed, to_state=S.LEASED)
    assert lease.data["claim"] == "warm" and lease.data["fencing_token"] == 1 and "claim_ms" in lease.data
    assert lease.reason == "warm claim"


@pytest.mark.django_db
def test_a_claim_on_an_empty_pool_is_a_miss_that_changes_nothing():
    fleet = make_fleet()
    assert services.sandbox_claim_warm(fleet=fleet, holder="x", lease_seconds=60) is None
    assert not Sandbox.objects.exists()


def _claim_in_steps(*, fleet, holder, lease_seconds, count_hit):
    return services._claim_warm_orm(fleet, holder, lease_seconds, "warm", None, count_hit)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim", [services.sandbox_claim_warm, _claim_in_steps], ids=["one-statement", "orm-steps"])
def test_concurrent_claimers_each_get_a_different_sandbox_and_none_is_leased_twice(claim):
    fleet = make_fleet(max_warm=40, max_total=40)
    rows = warm_rows(fleet, 30)
    claims: list[int] = []
    lock, start = threading.Lock(), threading.Barrier(8)

    def claimer(index: int) -> None:
        start.wait()
        try:
            while (sandbox := claim(fleet=fleet, holder=f"w{index}", lease_seconds=60, count_hit=True)):
                with lock:
                    claims.append(sandbox.pk)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(claims) == sorted(s.pk for s in rows)  # every one claimed, none twice
    leased = Sandbox.objects.filter(fleet=fleet)
    assert set(leased.values_list("state", flat=True)) == {S.LEASED}
    assert set(leased.values_list("fencing_token", flat=True)) == {1}
    assert SandboxEvent.objects.filter(fleet=fleet, to_state=S.LEASED).count() == 30
    fleet.refresh_from_db()
    assert fleet.claims_hit == 30


@pytest.mark.django_db
def test_a_heartbeat_extends_only_the_current_lease():
    fleet = make_fleet()
    warm_rows(fleet, 1)
    sandbox = services.sandbox_claim_warm(fleet=fleet, holder="a", lease_seconds=5)
    before = Sandbox.objects.get(pk=sandbox.pk).lease_expires_at

    assert services.sandbox_heartbeat(sandbox_id=sandbox.pk, fencing_token=1, lease_seconds=600) is True
    assert services.sandbox_heartbeat(sandbox_id=sandbox.pk, fencing_token=0, lease_seconds=9999) is False

    after = Sandbox.objects.get(pk=sandbox.pk).lease_expires_at
    assert after - before > timedelta(seconds=500)
    assert after < timezone.now() + timedelta(seconds=601)


@pytest.mark.django_db
def test_a_stale_fencing_token_is_refused_and_the_refusal_is_logged():
    fleet = make_fleet(max_total=4)
    warm_rows(fleet, 1)
    sandbox = services.sandbox_claim_warm(fleet=fleet, holder="first", lease_seconds=60)
    # The lease is taken back (as the reconciler does when it expires) and the sandbox is leased again.
    services.sandbox_transition(sandbox=sandbox, to=S.WARM, expect=(S.LEASED,), reason="lease expired")
    again = services.sandbox_claim_warm(fleet=fleet, holder="second", lease_seconds=60)
    assert again.pk == sandbox.pk and again.fencing_token == 2

    with pytest.raises(StaleFencingToken) as caught:
        services.sandbox_fence(sandbox_id=sandbox.pk, fencing_token=1)
    services.sandbox_fence(sandbox_id=sandbox.pk, fencing_token=2)

    assert "fencing token 1 is stale (current 2" in str(caught.value)
    refused = SandboxEvent.objects.get(sandbox=sandbox, kind="fence_refused")
    assert refused.data == {"fencing_token": 1, "current": 2}


@pytest.mark.django_db
def test_the_first_exec_of_a_lease_stamps_when_it_was_sent_and_later_execs_keep_it():
    fleet = make_fleet()
    warm_rows(fleet, 1)
    sandbox = services.sandbox_claim_warm(fleet=fleet, holder="a", lease_seconds=60)
    sent = timezone.now()
    services.sandbox_exec_recorded(sandbox=sandbox, command="ls", exit_code=0, duration_ms=5.0, started_at=sent,
                                   first=True, fencing_token=1, reason="harness")
    services.sandbox_exec_recorded(sandbox=sandbox, command="ls", exit_code=0, duration_ms=5.0,
                                   started_at=sent + timedelta(seconds=5), first=True, fencing_token=1)
    row = Sandbox.objects.get(pk=sandbox.pk)
    assert row.first_exec_at == sent and row.last_used_at > sent
    execs = SandboxEvent.objects.filter(sandbox=sandbox, kind="exec").order_by("id")
    assert [(e.reason, e.data["command"], e.data["fencing_token"]) for e in execs] == [("harness", "ls", 1), ("", "ls", 1)]


@pytest.mark.django_db
def test_the_fence_check_of_an_exec_is_one_query(django_assert_num_queries):
    fleet = make_fleet()
    warm_rows(fleet, 1)
    sandbox = services.sandbox_claim_warm(fleet=fleet, holder="a", lease_seconds=60)
    with django_assert_num_queries(1):
        services.sandbox_fence(sandbox_id=sandbox.pk, fencing_token=1)


@pytest.mark.django_db
def test_a_transition_from_an_unexpected_state_changes_nothing_and_logs_nothing():
    fleet = make_fleet()
    sandbox = warm_rows(fleet, 1)[0]
    before = len(events_of(sandbox))
    assert services.sandbox_transition(sandbox=sandbox, to=S.RELEASED, expect=(S.LEASED,)) is False
    assert Sandbox.objects.get(pk=sandbox.pk).state == S.WARM
    assert len(events_of(sandbox)) == before
    assert transitions_of(sandbox) == [S.REQUESTED, S.PROVISIONING, S.WARM]


@pytest.mark.django_db
def test_events_are_append_only():
    fleet = make_fleet()
    event = SandboxEvent.objects.filter(sandbox=warm_rows(fleet, 1)[0]).first()
    event.reason = "rewritten"
    with pytest.raises(Conflict):
        event.save()
