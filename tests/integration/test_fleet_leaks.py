"""Leak-proofing with real bubblewrap sandboxes: a worker killed while holding a lease, a sandbox killed from
outside, a sandbox removed behind Trove's back, an object nobody made a row for, a create retried after a
timeout. Each case ends, after the reconciler has run, with no orphan (no process, directory or cgroup
left) and no duplicate, and the event log says what happened."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.fleets.fleet_factories import (  # noqa: F401 (pool_backend is a fixture)
    events_of,
    make_fleet,
    pool_backend,
    start_django_process,
    transitions_of,
    wait_until,
)
from tests.webapp.rollouts.jobs_factories import Enqueued, make_endpoint, make_task_set
from webapp.fleets import services
from webapp.fleets.errors import StaleFencingToken
from webapp.fleets.models import Fleet, Sandbox, SandboxEvent
from webapp.rollouts.models import Rollout
from webapp.rollouts.services import job_create, rollout_start
from workers import fleet_ops
from workers.reconciler import fleet_reconcile
from workers.sandboxes import procs
from workers.sandboxes.base import SandboxSpec

S = Sandbox.State
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def assert_no_trace(backend, name: str) -> None:
    """Nothing of sandbox `name` is left: not listed, no directory, no cgroup, no process."""
    assert name not in {h.name for h in backend.list({})}
    directory = os.path.join(backend.root, name)
    assert not os.path.exists(directory)
    assert not [d for d in backend.cgroup_dirs(name) if os.path.exists(d)]
    assert procs.processes_mentioning(directory + "/") == []


def running_rollout(fleet: Fleet, lease: fleet_ops.Lease) -> Rollout:
    """A rollout in the middle of its run on `lease`, as the runner leaves it."""
    job = job_create(task_set=make_task_set(["t"]), fleet=fleet, endpoint=make_endpoint(model_names=["m"]),
                     model_name="m", enqueue=Enqueued())
    rollout = rollout_start(rollout_id=job.rollouts.get().pk, worker="worker-1")
    Rollout.objects.filter(pk=rollout.pk).update(sandbox=lease.sandbox)
    return rollout


CLAIM_AND_HANG = """
import sys, time
from webapp.fleets.models import Fleet
from workers import fleet_ops
lease = fleet_ops.sandbox_claim(fleet=Fleet.objects.get(pk={fleet_id}), holder="worker-doomed", lease_seconds=600)
result = fleet_ops.sandbox_exec(lease, "echo working > progress.txt")
print("claimed", lease.sandbox.pk, result.exit_code, flush=True)
time.sleep(600)
"""


def test_a_worker_killed_while_holding_a_lease_leaves_nothing_once_its_lease_expires(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=1, max_warm=1, max_total=2)
    fleet_reconcile(fleet=fleet)
    services.fleet_scale(fleet=fleet, min_warm=0)  # nothing new should appear: only the cleanup is watched
    worker = start_django_process(CLAIM_AND_HANG.format(fleet_id=fleet.pk),
                                  env={"TROVE_SANDBOX_ROOT": pool_backend.root})
    line = worker.stdout.readline()
    assert line.startswith("claimed"), worker.stderr.read()
    sandbox = Sandbox.objects.get(pk=int(line.split()[1]))

    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    assert sandbox.name in {h.name for h in pool_backend.list({})}  # the sandbox outlives its user ...
    assert fleet_reconcile(fleet=fleet)["reaped"] == 0  # ... and is left alone while the lease runs
    # Time passes: the dead worker's lease runs out (moved to the past rather than slept through, so the
    # test does not depend on how long a claim, a kill and a reconcile take on a loaded machine).
    Sandbox.objects.filter(pk=sandbox.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    report = fleet_reconcile(fleet=fleet)

    sandbox.refresh_from_db()
    assert report["reaped"] == 1 and sandbox.state == S.TERMINATED
    assert transitions_of(sandbox)[-4:] == [S.WARM, S.LEASED, S.TERMINATING, S.TERMINATED]
    log = events_of(sandbox)
    assert ("exec", "", "") in log
    assert ("transition", S.TERMINATING, "lease of worker-doomed expired") in log
    assert_no_trace(pool_backend, sandbox.name)
    assert Sandbox.objects.filter(fleet=fleet).count() == 1


def test_a_sandbox_killed_from_outside_is_failed_its_rollout_told_and_everything_removed(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=2, max_warm=2, max_total=4)
    fleet_reconcile(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:worker-1")
    rollout = running_rollout(fleet, lease)
    spare = Sandbox.objects.get(fleet=fleet, state=S.WARM)
    enqueued = Enqueued()
    for sandbox in (lease.sandbox, spare):
        supervisor = pool_backend.get(sandbox.name).details["pid"]
        bwrap = [pid for pid in procs.children(supervisor) if _comm(pid) == "bwrap"]
        assert bwrap, "the sandbox's bwrap process"
        os.kill(bwrap[0], signal.SIGKILL)  # kill -9 from outside, as the OOM killer or an operator might
    wait_until(lambda: {pool_backend.get(s.name).state for s in (lease.sandbox, spare)} == {"failed"},
               what="the backend to see both dead")

    report = fleet_reconcile(fleet=fleet, enqueue=enqueued)

    assert report["lost"] == 2
    for sandbox in (lease.sandbox, spare):
        sandbox.refresh_from_db()
        assert sandbox.state == S.TERMINATED
        assert transitions_of(sandbox)[-3:] == [S.FAILED, S.TERMINATING, S.TERMINATED]
        failed = SandboxEvent.objects.get(sandbox=sandbox, to_state=S.FAILED)
        assert failed.reason.startswith("backend reports failed: processes exited")
        assert_no_trace(pool_backend, sandbox.name)
    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.QUEUED and f"sandbox {lease.sandbox.name} failed" in rollout.error
    assert enqueued.ids == [rollout.pk]
    told = SandboxEvent.objects.get(sandbox=lease.sandbox, kind="rollout_told")
    assert told.data == {"rollout": rollout.pk, "outcome": "requeued"}
    with pytest.raises(StaleFencingToken):
        fleet_ops.sandbox_exec(lease, "true")
    assert report["created"] == 2 and Sandbox.objects.filter(fleet=fleet, state=S.WARM).count() == 2


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_a_sandbox_removed_behind_trove_s_back_is_lost_and_its_rollout_told(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=1, max_warm=1, max_total=2)
    fleet_reconcile(fleet=fleet)
    lease = fleet_ops.sandbox_claim(fleet=fleet, holder="rollout:worker-1")
    rollout = running_rollout(fleet, lease)
    Rollout.objects.filter(pk=rollout.pk).update(attempt=3)  # its last attempt: it cannot be requeued
    pool_backend.destroy(lease.sandbox.name)

    report = fleet_reconcile(fleet=fleet, enqueue=Enqueued())

    sandbox = Sandbox.objects.get(pk=lease.sandbox.pk)
    assert report["lost"] == 1 and sandbox.state == S.TERMINATED
    assert ("transition", S.LOST, "backend object vanished") in events_of(sandbox)
    rollout.refresh_from_db()
    assert rollout.status == Rollout.Status.INFRA_ERROR and "vanished" in rollout.error
    assert SandboxEvent.objects.get(sandbox=sandbox, kind="rollout_told").data["outcome"] == "infra_error"
    assert_no_trace(pool_backend, sandbox.name)


def test_a_sandbox_with_the_fleet_label_but_no_row_is_deleted_after_the_grace_period(pool_backend):  # noqa: F811
    fleet = make_fleet()
    intruder = pool_backend.create(SandboxSpec(name="made-by-hand", labels={"trove.dev/fleet": str(fleet.pk)}))
    assert intruder.state == "ready"

    seen = fleet_reconcile(fleet=fleet, orphan_grace_s=1.0)
    assert "made-by-hand" in {h.name for h in pool_backend.list({})}  # not before the grace period
    time.sleep(1.1)
    deleted = fleet_reconcile(fleet=fleet, orphan_grace_s=1.0)

    assert (seen["orphans_seen"], seen["orphans_deleted"], deleted["orphans_deleted"]) == (1, 0, 1)
    log = list(SandboxEvent.objects.filter(fleet=fleet, sandbox_name="made-by-hand").order_by("id")
               .values_list("kind", "sandbox"))
    assert log == [("orphan_seen", None), ("orphan_deleted", None)]
    assert_no_trace(pool_backend, "made-by-hand")
    fleet.refresh_from_db()
    assert fleet.orphans_seen == {} and not Sandbox.objects.filter(fleet=fleet).exists()


def test_an_object_that_outlived_its_terminated_row_is_deleted_at_once(pool_backend):  # noqa: F811
    fleet = make_fleet()
    sandbox = fleet_ops.sandbox_provision(fleet=fleet)
    # A destroy that reported success while the object came back (a create racing the destroy).
    services.sandbox_transition(sandbox=sandbox, to=S.TERMINATED, expect=(S.WARM,), reason="destroyed")

    report = fleet_reconcile(fleet=fleet, orphan_grace_s=3600)

    assert report["orphans_deleted"] == 1
    assert events_of(sandbox)[-1] == ("orphan_deleted", "", "object outlived its terminated row")
    assert_no_trace(pool_backend, sandbox.name)


def test_a_create_retried_after_the_first_attempt_timed_out_makes_one_sandbox(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=1, max_warm=1)
    row = services.sandboxes_request(fleet=fleet, n=1)[0]
    first = fleet_ops.sandbox_create(sandbox=row, wait=False)  # sent; its caller gave up waiting
    assert first.state == S.PROVISIONING

    again = fleet_ops.sandbox_create(sandbox=row, wait=True, timeout=30)  # the retry, same row, same name
    report = fleet_reconcile(fleet=fleet)

    assert again.state == S.WARM and report["created"] == 0
    assert [h.name for h in pool_backend.list({})] == [row.name]
    assert Sandbox.objects.filter(fleet=fleet).count() == 1
    assert transitions_of(row) == [S.REQUESTED, S.PROVISIONING, S.WARM]


def test_a_create_that_timed_out_is_cleaned_up_and_replaced_by_exactly_one(pool_backend):  # noqa: F811
    fleet = make_fleet(min_warm=1, max_warm=1)
    row = services.sandboxes_request(fleet=fleet, n=1, creator_waits=True)[0]

    with pytest.raises(Exception) as caught:
        fleet_ops.sandbox_create(sandbox=row, wait=True, timeout=0.001)
    report = fleet_reconcile(fleet=fleet)

    assert caught.value.reason == "timeout"
    row.refresh_from_db()
    assert row.state == S.TERMINATED and transitions_of(row)[-3:] == [S.FAILED, S.TERMINATING, S.TERMINATED]
    assert SandboxEvent.objects.get(sandbox=row, to_state=S.FAILED).data == {"reason": "timeout", "permanent": False}
    assert report["created"] == 1
    warm = Sandbox.objects.get(fleet=fleet, state=S.WARM)
    assert [h.name for h in pool_backend.list({})] == [warm.name]
    assert_no_trace(pool_backend, row.name)
