"""How the Kubernetes backend reads pod status and API errors, and names its objects. Pure functions:
no cluster needed (the same functions run against the real API server in test_kubernetes.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes import client as k8s

from workers.sandboxes.kubernetes import classify_api_error, object_name, observe_pod


def pod(*, phase: str = "Pending", deleting: bool = False, reason: str | None = None, ip: str | None = None,
        conditions: list[dict[str, Any]] | None = None, state: dict[str, Any] | None = None) -> k8s.V1Pod:
    status: dict[str, Any] = {"phase": phase, "podIP": ip, "reason": reason, "conditions": conditions or []}
    if state is not None:
        status["containerStatuses"] = [{"name": "sandbox", "image": "i", "imageID": "", "ready": False,
                                        "restartCount": 0, "state": state}]
    meta: dict[str, Any] = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return k8s.V1Pod.from_dict({"metadata": meta, "status": status})


def api_error(status: int, message: str) -> k8s.ApiException:
    exc = k8s.ApiException(status=status, reason="x")
    exc.body = json.dumps({"kind": "Status", "message": message})
    return exc


READY = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled_is_a_permanent_failure(reason):
    verdict = observe_pod(pod(state={"waiting": {"reason": reason, "message": "no"}}))

    assert (verdict.state, verdict.reason, verdict.permanent) == ("failed", reason, True)


def test_an_unschedulable_pod_is_still_provisioning_with_the_reason():
    verdict = observe_pod(pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                           "message": "0/3 nodes are available: 3 Insufficient cpu."}]))

    assert (verdict.state, verdict.reason, verdict.permanent) == ("provisioning", "Unschedulable", False)
    assert "Insufficient cpu" in verdict.message


def test_a_running_ready_pod_with_an_ip_is_ready_and_one_without_readiness_is_not():
    assert observe_pod(pod(phase="Running", ip="10.0.0.5", conditions=READY)).state == "ready"
    not_ready = observe_pod(pod(phase="Running", ip="10.0.0.5", conditions=[{"type": "Ready", "status": "False"}]))
    assert (not_ready.state, not_ready.reason) == ("provisioning", "NotReady")


def test_a_pod_being_deleted_is_terminating_whatever_its_phase():
    assert observe_pod(pod(phase="Running", ip="10.0.0.5", conditions=READY, deleting=True)).state == "terminating"


def test_an_evicted_pod_failed_transiently_but_an_exited_agent_failed_permanently():
    evicted = observe_pod(pod(phase="Failed", reason="Evicted"))
    exited = observe_pod(pod(phase="Failed", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))

    assert (evicted.state, evicted.permanent) == ("failed", False)
    assert (exited.state, exited.reason, exited.permanent) == ("failed", "OOMKilled(137)", True)


def test_an_exceeded_quota_is_transient_but_an_rbac_refusal_is_permanent():
    quota = api_error(403, 'pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0')
    rbac = api_error(403, 'pods is forbidden: User "u" cannot create resource "pods"')

    assert classify_api_error(quota) == ("quota", False)
    assert classify_api_error(rbac) == ("forbidden", True)


@pytest.mark.parametrize(("status", "expected"), [
    (422, ("invalid", True)), (401, ("unauthorized", True)), (409, ("conflict", False)),
    (429, ("api_unavailable", False)), (500, ("api_unavailable", False)), (503, ("api_unavailable", False)),
])
def test_api_errors_say_whether_a_retry_can_help(status, expected):
    assert classify_api_error(api_error(status, "boom")) == expected


def test_object_names_are_valid_dns_labels_and_deterministic():
    odd = "Fleet 7 / Sandbox #0042 with a name far longer than a Kubernetes label may be"

    assert object_name("fleet-7-sb-42") == "fleet-7-sb-42"
    assert object_name(odd) == object_name(odd)
    assert object_name(odd) != object_name(odd + "x")
    assert len(object_name(odd)) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", object_name(odd))
