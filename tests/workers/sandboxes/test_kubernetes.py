"""The Kubernetes backend against a real kube-apiserver on loopback, with the test kubelet running pods as
local processes (each with its own loopback pod IP) and the real in-sandbox agent."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.utils.quantity import parse_quantity

from tests.kube.fixtures import wait_for
from workers.sandboxes.base import (
    AgentAuthError,
    AgentUnavailable,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    SandboxStartFailed,
)
from workers.sandboxes.kubernetes import (
    LABEL_FLEET,
    LABEL_SANDBOX,
    KubernetesBackend,
    KubeSandboxConfig,
    SandboxObservation,
    fleet_object_name,
)

pytestmark = [pytest.mark.kube]

IMAGE = "registry.trove.test/sandbox@sha256:" + "0" * 64


@pytest.fixture
def core(kube_cluster) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_cluster.api_client())


@pytest.fixture
def kube_backend(kube_cluster, kube_kubelet, kube_namespace) -> KubernetesBackend:
    return KubernetesBackend(namespace=kube_namespace, api_client=kube_cluster.api_client(),
                             config=KubeSandboxConfig(default_image=IMAGE))


def objects_of(core: k8s.CoreV1Api, namespace: str, sandbox: str) -> tuple[list[str], list[str]]:
    selector = f"{LABEL_SANDBOX}={sandbox}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    secrets = core.list_namespaced_secret(namespace, label_selector=selector).items
    return [p.metadata.name for p in pods], [s.metadata.name for s in secrets]


def wait_nothing_left(core: k8s.CoreV1Api, namespace: str, sandbox: str) -> None:
    wait_for(lambda: objects_of(core, namespace, sandbox) == ([], []), what=f"{sandbox}'s pod and secret to go")


def test_a_sandbox_runs_commands_and_files_through_its_agent_at_the_pod_ip(kube_backend, core, kube_kubelet, kube_namespace):
    handle = kube_backend.create(SandboxSpec(name="sb-life", labels={LABEL_FLEET: "f1"}, cpu=0.5, memory_mb=256))

    assert handle.state == "ready"
    assert handle.endpoint.startswith("tcp:127.") and handle.endpoint.endswith(":7070")
    assert handle.endpoint == f"tcp:{handle.details['pod_ip']}:7070"
    assert kube_backend.exec(handle, "echo hi").stdout == "hi\n"
    kube_backend.write_file(handle, "notes/a.txt", b"written from the host\n")
    assert kube_backend.read_file(handle, "notes/a.txt") == b"written from the host\n"
    assert kube_backend.exec(handle, "cat notes/a.txt; pwd").stdout.startswith("written from the host\n")
    if os.geteuid() == 0:  # only root can switch users, so only then does the kubelet honour runAsUser
        assert kube_backend.exec(handle, "id -u").stdout.strip() == "1000"
    kube_backend.exec(handle, "sleep 300 >/dev/null 2>&1 &")  # outlives its shell
    assert len(kube_kubelet.pod_processes(handle.details["uid"])) == 2  # the agent and the sleep

    kube_backend.destroy("sb-life")

    wait_nothing_left(core, kube_namespace, "sb-life")
    wait_for(lambda: not kube_kubelet.pod_processes(handle.details["uid"]), what="the pod's processes to end")
    assert kube_kubelet.pod_dir(kube_namespace, "sb-life") is None
    with pytest.raises(SandboxNotFound):
        kube_backend.get("sb-life")


def test_destroy_is_idempotent(kube_backend, core, kube_namespace):
    kube_backend.create(SandboxSpec(name="sb-twice"))

    kube_backend.destroy("sb-twice")
    kube_backend.destroy("sb-twice")
    kube_backend.destroy("sb-never-existed")

    wait_nothing_left(core, kube_namespace, "sb-twice")


def test_a_retried_create_adopts_the_sandbox_it_already_made(kube_backend, core, kube_namespace):
    first = kube_backend.create(SandboxSpec(name="sb-retry"), wait=False)
    second = kube_backend.create(SandboxSpec(name="sb-retry"))

    assert second.state == "ready"
    assert second.details["uid"] == first.details["uid"]
    assert second.secret == first.secret  # the pod mounts the first secret; the retry must hand out the same
    assert objects_of(core, kube_namespace, "sb-retry") == (["sb-retry"], ["sb-retry-agent"])
    assert kube_backend.exec(second, "echo again").stdout == "again\n"


def test_a_create_that_timed_out_and_is_retried_makes_one_sandbox(kube_backend, core, kube_kubelet, kube_namespace):
    with kube_kubelet.paused(), pytest.raises(SandboxStartFailed) as failed:
        kube_backend.create(SandboxSpec(name="sb-slow"), timeout=1.5)

    assert failed.value.permanent is False
    assert failed.value.reason == "timeout"
    handle = kube_backend.create(SandboxSpec(name="sb-slow"))

    assert handle.state == "ready"
    assert objects_of(core, kube_namespace, "sb-slow") == (["sb-slow"], ["sb-slow-agent"])
    assert kube_backend.exec(handle, "echo once").stdout == "once\n"


def test_an_image_that_cannot_be_pulled_fails_permanently_and_leaves_nothing(kube_backend, core, kube_namespace):
    with pytest.raises(SandboxStartFailed) as failed:
        kube_backend.create(SandboxSpec(name="sb-badimg", image="trove.invalid/bad"), timeout=20)

    assert failed.value.permanent is True
    assert failed.value.reason in ("ErrImagePull", "ImagePullBackOff")
    wait_nothing_left(core, kube_namespace, "sb-badimg")


def test_an_image_without_the_agent_fails_permanently_and_leaves_nothing(kube_cluster, core, kube_namespace):
    broken = KubernetesBackend(namespace=kube_namespace, api_client=kube_cluster.api_client(),
                               config=KubeSandboxConfig(default_image=IMAGE, agent_command=("/opt/trove/missing",)))

    with pytest.raises(SandboxStartFailed) as failed:
        broken.create(SandboxSpec(name="sb-noagent"), timeout=20)

    assert (failed.value.reason, failed.value.permanent) == ("RunContainerError", True)
    wait_nothing_left(core, kube_namespace, "sb-noagent")


def test_an_unschedulable_sandbox_fails_transiently_and_leaves_nothing(kube_backend, core, kube_namespace):
    with pytest.raises(SandboxStartFailed) as failed:
        kube_backend.create(SandboxSpec(name="sb-huge", cpu=4096), timeout=8)

    assert failed.value.permanent is False
    assert failed.value.reason == "Unschedulable"
    wait_nothing_left(core, kube_namespace, "sb-huge")


def test_an_exceeded_quota_is_a_transient_quota_error_and_leaves_nothing(kube_backend, core, kube_namespace):
    core.create_namespaced_resource_quota(kube_namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})
    # The quota controller (not running here) would fill in the status; admission needs it to decide.
    core.replace_namespaced_resource_quota_status("no-pods", kube_namespace, {
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}},
        "status": {"hard": {"pods": "0"}, "used": {"pods": "0"}},
    })

    with pytest.raises(SandboxStartFailed) as failed:
        kube_backend.create(SandboxSpec(name="sb-quota"))

    assert failed.value.reason == "quota"
    assert failed.value.permanent is False
    assert objects_of(core, kube_namespace, "sb-quota") == ([], [])


def test_list_finds_sandboxes_by_label_including_pods_the_backend_did_not_create(kube_backend, core, kube_namespace):
    kube_backend.create(SandboxSpec(name="sb-mine", labels={LABEL_FLEET: "f-list"}))
    kube_backend.create(SandboxSpec(name="sb-other-fleet", labels={LABEL_FLEET: "f-else"}))
    core.create_namespaced_pod(kube_namespace, {
        "metadata": {"name": "stray", "labels": {LABEL_FLEET: "f-list"}},
        "spec": {"containers": [{"name": "c", "image": IMAGE}]},
    })

    listed = {h.name: h for h in kube_backend.list({LABEL_FLEET: "f-list"})}

    assert set(listed) == {"sb-mine", "stray"}
    assert listed["sb-mine"].state == "ready" and listed["sb-mine"].secret
    assert listed["stray"].secret == ""
    assert [h.name for h in kube_backend.list({LABEL_FLEET: "f-else"})] == ["sb-other-fleet"]


def test_a_pod_deleted_behind_the_backends_back_is_gone_and_the_watch_says_so(kube_backend, core, kube_namespace):
    seen: list[SandboxObservation] = []
    stop = threading.Event()
    watcher = threading.Thread(target=kube_backend.watch_sandboxes, args=({LABEL_FLEET: "f-watch"}, seen.append, stop),
                               kwargs={"poll_seconds": 1}, daemon=True)
    watcher.start()
    try:
        kube_backend.create(SandboxSpec(name="sb-watched", labels={LABEL_FLEET: "f-watch"}))
        wait_for(lambda: any(o.handle.name == "sb-watched" and o.handle.state == "ready" for o in seen),
                 what="the watch to report the sandbox ready")

        core.delete_namespaced_pod("sb-watched", kube_namespace)

        wait_for(lambda: any(o.kind == "deleted" and o.handle.name == "sb-watched" for o in seen),
                 what="the watch to report the deletion")
    finally:
        stop.set()
        watcher.join(timeout=10)
    with pytest.raises(SandboxNotFound):
        kube_backend.get("sb-watched")
    states = [o.handle.state for o in seen if o.handle.name == "sb-watched"]
    assert states[-1] == "gone"
    assert "terminating" in states
    assert not watcher.is_alive()


def test_a_sandbox_whose_agent_died_is_reported_failed(kube_backend, kube_kubelet):
    handle = kube_backend.create(SandboxSpec(name="sb-dies"))
    if os.geteuid() == 0:  # the agent has a uid of its own, so a command cannot kill it
        assert kube_backend.exec(handle, "kill -9 $PPID; echo $?").stdout == "1\n"  # $PPID is the agent
        assert kube_backend.exec(handle, "exit 3").exit_code == 3
    agent_pid = next(pid for pid in kube_kubelet.pod_processes(handle.details["uid"])
                     if b"--listen" in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.kill(agent_pid, 9)

    with pytest.raises(AgentUnavailable):
        kube_backend.exec(handle, "echo never", timeout=10)

    failed = wait_for(lambda: (h := kube_backend.get("sb-dies")).state == "failed" and h, what="the pod to fail")
    assert failed.reason.startswith("Error")
    assert failed.details["permanent"] is True


@pytest.mark.skipif(os.geteuid() != 0, reason="the test kubelet honours runAsUser only as root")
def test_a_command_cannot_read_the_agents_secret_or_touch_the_agent(kube_backend):
    handle = kube_backend.create(SandboxSpec(name="sb-attack"))

    attack = kube_backend.exec(handle, """
        cat /var/run/trove/agent/secret; env | grep -i secret
        cat /proc/$PPID/environ /proc/$PPID/mem 2>&1 | head -c 300; ls /proc/$PPID/fd 2>&1
        kill -STOP $PPID; kill -9 $PPID; echo "kill=$?"
        grep -E '^(Uid|CapEff|NoNewPrivs):' /proc/self/status
    """)

    assert handle.secret not in attack.stdout + attack.stderr
    assert "kill=1" in attack.stdout and "Permission denied" in attack.stdout + attack.stderr
    assert [line.split()[1] for line in attack.stdout.splitlines()[-3:]] == ["1000", "0" * 16, "1"]
    assert kube_backend.exec(handle, "exit 3").exit_code == 3
    kube_backend.destroy("sb-attack")


def test_the_agent_refuses_a_wrong_secret(kube_backend):
    handle = kube_backend.create(SandboxSpec(name="sb-secret"))
    forged = SandboxHandle(name=handle.name, state=handle.state, endpoint=handle.endpoint, secret="guess")

    with pytest.raises(AgentAuthError):
        kube_backend.exec(forged, "echo should-not-run")


def test_the_pod_spec_holds_the_security_settings(kube_backend, core, kube_namespace):
    kube_backend.create(SandboxSpec(name="sb-secure", labels={LABEL_FLEET: "f-sec", "team": "rl"}, cpu=0.25,
                               memory_mb=300, disk_mb=2048, env={"TASK": "t-17"}), wait=False)

    pod = core.read_namespaced_pod("sb-secure", kube_namespace)
    secret = core.read_namespaced_secret("sb-secure-agent", kube_namespace)
    fleet = core.read_namespaced_config_map(fleet_object_name("f-sec"), kube_namespace)

    spec, container = pod.spec, pod.spec.containers[0]
    assert spec.automount_service_account_token is False
    assert spec.restart_policy == "Never"
    assert spec.security_context.run_as_non_root is True and spec.security_context.run_as_user == 1000
    ctx = container.security_context
    assert ctx.allow_privilege_escalation is False and ctx.privileged is False
    assert ctx.read_only_root_filesystem is True
    # The agent's user: 0 with just enough to start commands as 1000 (with nothing) and kill them.
    assert ctx.run_as_user == 0 and ctx.capabilities.drop == ["ALL"]
    assert sorted(ctx.capabilities.add) == ["KILL", "SETGID", "SETUID"]
    assert container.args[container.args.index("--run-as") + 1] == "1000:1000"
    assert spec.volumes[-1].secret.default_mode == 0o400 or any(
        v.secret and v.secret.default_mode == 0o400 for v in spec.volumes)
    assert container.resources.requests == container.resources.limits == {
        "cpu": "250m", "memory": "300Mi", "ephemeral-storage": "2304Mi"}
    volumes = {v.name: v for v in spec.volumes}
    assert parse_quantity(volumes["workspace"].empty_dir.size_limit) == 2048 * 2**20  # the API writes "2Gi"
    assert volumes["tmp"].empty_dir is not None
    assert volumes["agent-secret"].secret.secret_name == "sb-secure-agent"
    assert {m.mount_path: m.read_only for m in container.volume_mounts} == {
        "/workspace": None, "/tmp": None, "/var/run/trove/agent": True}
    assert {e.name: e.value for e in container.env} == {"TASK": "t-17"}
    assert pod.metadata.labels[LABEL_FLEET] == "f-sec" and pod.metadata.labels["team"] == "rl"
    assert [(o.kind, o.uid) for o in pod.metadata.owner_references] == [("ConfigMap", fleet.metadata.uid)]
    assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("ConfigMap", fleet.metadata.uid)]


def test_the_fleet_network_policy_allows_egress_only_to_the_proxy(kube_backend, kube_cluster, kube_namespace):
    net = k8s.NetworkingV1Api(kube_cluster.api_client())

    kube_backend.ensure_fleet_policy("f-net", proxy_cidr="10.96.0.50/32", proxy_port=8001)
    kube_backend.ensure_fleet_policy("f-net", proxy_cidr="10.96.0.51/32", proxy_port=8001)  # updated in place

    policies = net.list_namespaced_network_policy(kube_namespace, label_selector=f"{LABEL_FLEET}=f-net").items
    assert len(policies) == 1
    policy = policies[0].spec
    assert policy.pod_selector.match_labels == {LABEL_FLEET: "f-net"}
    assert set(policy.policy_types) == {"Ingress", "Egress"}
    assert len(policy.egress) == 1
    assert [peer.ip_block.cidr for peer in policy.egress[0].to] == ["10.96.0.51/32"]
    assert [(p.protocol, p.port) for p in policy.egress[0].ports] == [("TCP", 8001)]
    assert [(p.protocol, p.port) for p in policy.ingress[0].ports] == [("TCP", 7070)]

    kube_backend.ensure_fleet_policy("f-net", network="none")

    closed = net.read_namespaced_network_policy(policies[0].metadata.name, kube_namespace).spec
    assert not closed.egress  # nothing allowed out
    assert "Egress" in closed.policy_types


def test_deleting_the_fleet_removes_its_owner_object(kube_backend, core, kube_namespace):
    kube_backend.create(SandboxSpec(name="sb-owned", labels={LABEL_FLEET: "f-gone"}), wait=False)

    kube_backend.delete_fleet("f-gone")
    kube_backend.delete_fleet("f-gone")

    names = [c.metadata.name for c in core.list_namespaced_config_map(kube_namespace).items]
    assert fleet_object_name("f-gone") not in names
    # The pod and secret go with it through the garbage collector (owner references), which needs the
    # controller-manager: not running here, so only the references are checked (see the spec test).


def test_api_calls_are_counted(kube_backend):
    kube_backend.create(SandboxSpec(name="sb-count"))
    kube_backend.destroy("sb-count")

    assert kube_backend.api_calls == sum(kube_backend.api_calls_by_method.values())
    assert kube_backend.api_calls_by_method["create_namespaced_pod"] == 1
    assert kube_backend.api_calls_by_method["delete_namespaced_pod"] == 1
