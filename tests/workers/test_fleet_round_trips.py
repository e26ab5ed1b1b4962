"""Round-trip budgets of the sandbox hot path (a rollout's claim, execs, file writes, release), on Postgres
in autocommit as in production: every statement is counted and must run outside a transaction (a statement
inside one costs a BEGIN and a COMMIT round trip more). A change that adds a query, or wraps one in a
transaction, fails here."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (pool_backend is a fixture)
    events_of,
    make_fleet,
    make_template,
    pool_backend,
    transitions_of,
    warm_rows,
)
from webapp.fleets import services
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import Sandbox, SandboxEvent
from workers import fleet_ops
from workers.sandboxes.base import SandboxError

S = Sandbox.State
pytestmark = pytest.mark.django_db(transaction=True)


class Statements:
    """Each statement sent on this thread's connection, with whether it ran inside a transaction."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        self.sent.append((sql.split()[0].upper(), connection.in_atomic_block))
        return execute(sql, params, many, context)

    @property
    def in_transactions(self) -> list[str]:
        return [verb for verb, in_block in self.sent if in_block]


def counted(function, *args, **kwargs):
    statements = Statements()
    with connection.execute_wrapper(statements):
        result = function(*args, **kwargs)
    return result, statements


def test_a_warm_claim_exec_write_release_cycle_is_one_round_trip_per_step_in_autocommit(pool_backend):  # noqa: F811
    fleet = make_fleet()
    fleet_ops.sandbox_provision(fleet=fleet)

    lease, claim = counted(fleet_ops.sandbox_claim, fleet=fleet, holder="rollout:1")
    _, first = counted(fleet_ops.sandbox_exec, lease, "true", reason="harness")
    _, second = counted(fleet_ops.sandbox_exec, lease, "exit 3", reason="eval")
    _, write = counted(fleet_ops.sandbox_write_files, lease, {"a.txt": "a\n"})
    _, release = counted(fleet_ops.sandbox_release, lease)

    assert len(claim.sent) == 1  # pick, lease, event and hit counter: one statement
    assert len(first.sent) == len(second.sent) == 2  # the fence check; the exec's log with its touch
    assert len(write.sent) == 2  # the fence check; the event
    # released, the reuse facts (one read with its joins), terminating, terminated (after the destroy)
    assert len(release.sent) == 4
    for statements in (claim, first, second, write, release):
        assert statements.in_transactions == []
    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert sandbox.state == S.TERMINATED and pool_backend.list({}) == []
    assert [(kind, to or reason) for kind, to, reason in events_of(sandbox)][-7:] == [
        ("transition", S.LEASED), ("exec", "harness"), ("exec", "eval"), ("write_files", "1 file(s)"),
        ("transition", S.RELEASED), ("transition", S.TERMINATING), ("transition", S.TERMINATED),
    ]


def test_a_transition_is_one_statement_that_logs_the_state_the_row_really_left():
    fleet = make_fleet()
    sandbox = warm_rows(fleet, 1)[0]
    stale = Sandbox.objects.get(pk=sandbox.pk)
    services.sandbox_claim_warm(fleet=fleet, holder="a", lease_seconds=60)  # warm -> leased behind `stale`

    moved, statements = counted(services.sandbox_transition, sandbox=stale, to=S.TERMINATING,
                                expect=(S.WARM, S.LEASED), reason="retired", lease_holder="")

    assert moved and len(statements.sent) == 1 and statements.in_transactions == []
    event = SandboxEvent.objects.filter(sandbox=sandbox, kind="transition").latest("id")
    assert (event.from_state, event.to_state, event.reason) == (S.LEASED, S.TERMINATING, "retired")
    row = Sandbox.objects.get(pk=sandbox.pk)
    assert (row.state, row.lease_holder, stale.state) == (S.TERMINATING, "", S.TERMINATING)
    assert row.terminated_at is None and row.released_at is None


def test_a_transition_whose_condition_fails_changes_and_logs_nothing_in_one_statement():
    fleet = make_fleet()
    sandbox = warm_rows(fleet, 1)[0]
    lease = services.sandbox_claim_warm(fleet=fleet, holder="a", lease_seconds=60)
    before = len(events_of(sandbox))

    moved, statements = counted(services.sandbox_transition, sandbox=lease, to=S.RELEASED, expect=(S.LEASED,),
                                where={"fencing_token": lease.fencing_token + 1}, reason="stale release")

    assert not moved and len(statements.sent) == 1
    assert Sandbox.objects.get(pk=sandbox.pk).state == S.LEASED and len(events_of(sandbox)) == before
    assert transitions_of(sandbox)[-1] == S.LEASED


def test_in_autocommit_an_exec_under_a_superseded_lease_is_still_refused_before_the_sandbox(pool_backend):  # noqa: F811
    fleet = make_fleet(template=make_template(reusable=True))
    fleet_ops.sandbox_provision(fleet=fleet)
    old = fleet_ops.sandbox_claim(fleet=fleet, holder="slow-worker")
    fleet_ops.sandbox_release(old)
    new = fleet_ops.sandbox_claim(fleet=fleet, holder="next-worker")

    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_exec(old, "touch written-by-the-stale-holder")
    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_write_files(old, {"stale.txt": "x"})

    assert fleet_ops.sandbox_exec(new, "ls").stdout == ""  # neither stale write reached the sandbox
    assert SandboxEvent.objects.filter(sandbox=new.sandbox, kind="fence_refused").count() == 2
    assert SandboxEvent.objects.filter(sandbox=new.sandbox, kind="exec", data__fencing_token=old.fencing_token,
                                       data__command__startswith="touch").count() == 0
    _, release = counted(fleet_ops.sandbox_release, new)
    assert len(release.sent) == 3 and release.in_transactions == []  # released, the reuse facts, warm again
    assert Sandbox.objects.get(pk=new.sandbox.pk).state == S.WARM


def test_an_exec_under_a_superseded_lease_to_a_dead_agent_is_refused_as_stale_not_as_the_agents_failure(
        pool_backend):  # noqa: F811
    fleet = make_fleet()
    fleet_ops.sandbox_provision(fleet=fleet)
    old = fleet_ops.sandbox_claim(fleet=fleet, holder="slow-worker")
    services.sandbox_transition(sandbox=Sandbox.objects.get(pk=old.sandbox.pk), to=S.WARM, expect=(S.LEASED,),
                                reason="lease expired", lease_holder="")
    new = fleet_ops.sandbox_claim(fleet=fleet, holder="next-worker")
    pool_backend.destroy(new.sandbox.name)  # the agent is gone: the connection fails before the fence runs

    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_exec(old, "true")
    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_write_files(old, {"a.txt": "a"})
    with pytest.raises(SandboxError):  # the current holder hears the agent's failure, logged
        fleet_ops.sandbox_exec(new, "true")

    refused = SandboxEvent.objects.filter(sandbox=new.sandbox, kind="fence_refused").count()
    failed = SandboxEvent.objects.filter(sandbox=new.sandbox, kind="exec_failed").values_list(
        "data__fencing_token", flat=True)
    assert refused == 2 and list(failed) == [new.fencing_token]


def test_a_cold_claim_counts_its_miss_and_leases_in_a_fixed_number_of_round_trips(pool_backend):  # noqa: F811
    fleet = make_fleet()  # nothing warm: the cold policy creates one on demand

    lease, claim = counted(fleet_ops.sandbox_claim, fleet=fleet, holder="rollout:1")

    # The claim that misses and counts it; the fleet's policy re-read; the request (the fleet row locked,
    # capacity counted, the row, its name, its event: one transaction, so the count holds); provisioning;
    # the lease with its event.
    assert len(claim.sent) == 9
    assert claim.in_transactions == ["SELECT", "SELECT", "INSERT", "UPDATE", "INSERT"]
    fleet.refresh_from_db()
    assert (fleet.claims_hit, fleet.claims_miss) == (0, 1)
    assert transitions_of(lease.sandbox) == [S.REQUESTED, S.PROVISIONING, S.LEASED]
    fleet_ops.sandbox_release(lease)
