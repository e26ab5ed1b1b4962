"""deploy/ against a real API server: the manifests are accepted, and the sandbox backend works with only
the Role from deploy/sandbox-rbac.yaml (a token authenticated as its ServiceAccount) and nothing more."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.kube.fixtures import BACKEND_USER, wait_for
from workers.sandboxes.base import SandboxSpec
from workers.sandboxes.kubernetes import LABEL_FLEET, LABEL_SANDBOX, KubernetesBackend, KubeSandboxConfig

pytestmark = [pytest.mark.kube]

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MANIFESTS = ["namespaces.yaml", "sandbox-rbac.yaml", "sandbox-networkpolicy.yaml", "trove.yaml"]
SANDBOX_NS = "trove-sandboxes"
IMAGE = "registry.trove.test/sandbox@sha256:" + "1" * 64


def apply(api_client: k8s.ApiClient, path: Path) -> list[str]:
    """Create every object in `path`; one that already exists (an earlier test applied it) is fine."""
    made = []
    try:
        for group in k8s_utils.create_from_yaml(api_client, str(path)):
            made += [f"{obj.kind}/{obj.metadata.name}" for obj in group]
    except k8s_utils.FailToCreateError as failure:
        refused = [exc for exc in failure.api_exceptions if exc.status != 409]
        if refused:
            raise
    return made


@pytest.fixture(scope="module")
def deployed(kube_cluster) -> None:
    admin = kube_cluster.api_client()
    for name in MANIFESTS:
        apply(admin, DEPLOY / name)


@pytest.fixture
def role_client(kube_cluster, deployed) -> k8s.ApiClient:
    return kube_cluster.api_client(token=kube_cluster.user(BACKEND_USER).token)


def test_every_deploy_manifest_is_accepted_by_the_api_server(kube_cluster, deployed):
    apps = k8s.AppsV1Api(kube_cluster.api_client())
    rbac = k8s.RbacAuthorizationV1Api(kube_cluster.api_client())

    deployments = {d.metadata.name for d in apps.list_namespaced_deployment("trove").items}
    role = rbac.read_namespaced_role("trove-sandbox-manager", SANDBOX_NS)

    assert deployments == {"trove-web", "trove-worker", "trove-beat", "trove-proxy"}
    assert {tuple(r.resources): set(r.verbs) for r in role.rules}[("pods",)] == {"create", "get", "list", "watch", "delete"}


def test_the_backend_runs_the_whole_lifecycle_with_only_the_sandbox_role(role_client, kube_kubelet, kube_cluster):
    backend = KubernetesBackend(namespace=SANDBOX_NS, api_client=role_client,
                                config=KubeSandboxConfig(default_image=IMAGE))
    admin = k8s.CoreV1Api(kube_cluster.api_client())

    handle = backend.create(SandboxSpec(name="rbac-life", labels={LABEL_FLEET: "rbac"}))
    result = backend.exec(handle, "echo hi")
    listed = [h.name for h in backend.list({LABEL_FLEET: "rbac"})]
    fetched = backend.get("rbac-life")
    backend.ensure_fleet_policy("rbac", proxy_cidr="10.96.0.50/32", proxy_port=8001)
    backend.ensure_fleet_policy("rbac", proxy_cidr="10.96.0.51/32", proxy_port=8001)
    backend.destroy("rbac-life")
    backend.delete_fleet("rbac")

    assert result.stdout == "hi\n"
    assert listed == ["rbac-life"]
    assert fetched.secret == handle.secret
    selector = f"{LABEL_SANDBOX}=rbac-life"
    wait_for(lambda: not admin.list_namespaced_pod(SANDBOX_NS, label_selector=selector).items, what="the pod to go")
    assert not admin.list_namespaced_secret(SANDBOX_NS, label_selector=selector).items


@pytest.mark.parametrize(
    "attempt",
    [
        pytest.param(lambda core, apps: core.list_namespaced_pod("default"), id="pods-in-another-namespace"),
        pytest.param(lambda core, apps: core.list_namespaced_secret("trove"), id="secrets-of-trove-itself"),
        pytest.param(lambda core, apps: core.create_namespaced_pod("trove", {
            "metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": IMAGE}]}}), id="pods-in-trove"),
        pytest.param(lambda core, apps: core.patch_namespaced_pod_status("x", SANDBOX_NS, {"status": {}}),
                     id="pod-status"),
        pytest.param(lambda core, apps: core.create_namespaced_binding(SANDBOX_NS, {
            "metadata": {"name": "x"}, "target": {"kind": "Node", "name": "n"}}, _preload_content=False), id="binding"),
        pytest.param(lambda core, apps: core.patch_namespaced_pod("x", SANDBOX_NS, {"metadata": {}}), id="pod-patch"),
        pytest.param(lambda core, apps: core.list_node(), id="nodes"),
        pytest.param(lambda core, apps: apps.list_namespaced_deployment(SANDBOX_NS), id="deployments"),
    ],
)
def test_the_sandbox_role_is_refused_beyond_what_it_needs(role_client, attempt):
    core, apps = k8s.CoreV1Api(role_client), k8s.AppsV1Api(role_client)

    with pytest.raises(k8s.ApiException) as refused:
        attempt(core, apps)

    assert refused.value.status == 403
    assert BACKEND_USER in (refused.value.body or "")
