"""Kubernetes sandbox backend: one Pod per sandbox, its agent reached at podIP:port.

Objects in the sandbox namespace, all labelled `trove.dev/sandbox=<object name>` plus the spec's labels
(`trove.dev/fleet` among them):
- Pod `<name>`: the sandbox. Requests = limits, no privilege escalation (no_new_privs), read-only root with
  emptyDirs for /workspace and /tmp, no service-account token, restartPolicy Never (a sandbox whose agent
  died has lost its state: it is replaced, not restarted). Two users, as in the local backend: the agent
  runs as uid 0 of the container with every capability dropped but SETUID, SETGID and KILL, and starts every
  command (and file operation) as `run_as_user` with none (`--run-as`), so no command can signal, trace or
  read the agent, or read its secret.
- Secret `<name>-agent`: the per-sandbox agent secret, mounted read-only into the pod, readable by the
  agent's uid only (0400; a file rather than an env var, so commands the agent runs do not inherit it).
- Per fleet: a ConfigMap `trove-fleet-<fleet>` that owns the fleet's pods, secrets and NetworkPolicy, so
  deleting it lets the garbage collector cascade; and a NetworkPolicy (`ensure_fleet_policy`) that denies
  egress except to the recording proxy.

Every call may be retried. Names are deterministic: a create that meets 409 Conflict adopts the existing
pod and secret (waiting out a previous incarnation that is still terminating). A create that fails
removes what it made. The API server stays off the exec path: exec, read and write go to the agent.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import re
import secrets as secrets_module
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from workers.sandboxes.agent_client import AgentClient
from workers.sandboxes.base import (
    AgentAuthError,
    AgentUnavailable,
    ExecResult,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    SandboxStartFailed,
)

log = logging.getLogger(__name__)

LABEL_SANDBOX = "trove.dev/sandbox"
LABEL_FLEET = "trove.dev/fleet"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NETWORK = "trove.dev/network"
ANNOTATION_NAME = "trove.dev/sandbox-name"
SECRET_KEY = "secret"
SECRET_MOUNT = "/var/run/trove/agent"
AGENT_CAPABILITIES = ("SETUID", "SETGID", "KILL")
CONTAINER = "sandbox"

# Container waiting reasons that no amount of waiting fixes: the image or the container config is wrong.
PERMANENT_WAITING = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable",
    "CreateContainerError", "RunContainerError", "CrashLoopBackOff",
})
# Pod-level failure reasons caused by the node, not the sandbox: a new pod elsewhere may well work.
TRANSIENT_POD_FAILURES = frozenset({"Evicted", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"})

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
T = TypeVar("T")
# A kubernetes.client.V1Pod. Typed Any because every field of the generated models is Optional, and the
# API server always fills in the ones read here (metadata, name, uid, resourceVersion).
Pod = Any


def object_name(name: str) -> str:
    """The pod name for sandbox `name`: itself when it is a valid DNS label, else a slug plus a hash
    (deterministic, so a retried create finds the same pod)."""
    if len(name) <= 63 and _DNS_LABEL.match(name):
        return name
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:48].strip("-") or "sandbox"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def secret_name(obj: str) -> str:
    return f"{obj}-agent"


def fleet_object_name(fleet: str) -> str:
    return object_name(f"trove-fleet-{fleet}")


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


@dataclass(frozen=True)
class KubeSandboxConfig:
    """Pod shape. Defaults fit deploy/ (namespace, image layout, uid)."""

    namespace: str = "trove-sandboxes"
    default_image: str = ""  # used when a spec carries none; pin by digest
    agent_port: int = 7070
    agent_command: tuple[str, ...] = ("python3", "/opt/trove/agent.py")
    workspace: str = "/workspace"
    default_cpu: float = 1.0
    default_memory_mb: int = 1024
    tmp_size_mb: int = 256
    run_as_user: int = 1000  # the commands' uid; the agent runs as 0 (see AGENT_CAPABILITIES)
    delete_grace_seconds: int = 5
    owner_references: bool = True
    runtime_class_name: str = ""  # e.g. "gvisor" where the cluster offers one
    node_selector: dict[str, str] = field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = ()
    # Who may open the agent port (the worker pods that run exec). Matched as a NetworkPolicy peer.
    agent_client_namespace_labels: dict[str, str] = field(default_factory=lambda: {"trove.dev/role": "control-plane"})
    agent_client_pod_labels: dict[str, str] = field(default_factory=dict)


class WatchExpired(Exception):
    """The API server no longer has history from our resourceVersion (410 Gone): relist."""


@dataclass(frozen=True)
class PodVerdict:
    """What a pod's status says about the sandbox, from `observe_pod`."""

    state: str  # provisioning | ready | failed | terminating
    reason: str = ""
    message: str = ""
    permanent: bool = False


@dataclass(frozen=True)
class SandboxObservation:
    """One change seen by `watch_sandboxes`: kind is added | modified | deleted."""

    kind: str
    handle: SandboxHandle
    resource_version: str = ""


def observe_pod(pod: Pod) -> PodVerdict:
    """Map a pod's status onto a sandbox state. Pure: unit-testable and used by create, get, list and watch."""
    if pod.metadata.deletion_timestamp is not None:
        return PodVerdict("terminating", "Terminating")
    status = pod.status or k8s.V1PodStatus()
    if status.phase in ("Failed", "Succeeded"):
        reason = status.reason or _terminated_reason(status) or status.phase
        return PodVerdict("failed", reason, status.message or "", permanent=reason not in TRANSIENT_POD_FAILURES)
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in PERMANENT_WAITING:
            return PodVerdict("failed", waiting.reason, waiting.message or "", permanent=True)
        terminated = cs.state.terminated if cs.state else None
        if terminated is not None:  # the agent exited; restartPolicy Never keeps it that way
            return PodVerdict("failed", terminated.reason or "ContainerExited", terminated.message or "", permanent=True)
    conditions = {c.type: c for c in status.conditions or []}
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        return PodVerdict("provisioning", scheduled.reason or "Unscheduled", scheduled.message or "")
    ready = conditions.get("Ready")
    if status.phase == "Running" and status.pod_ip and ready is not None and ready.status == "True":
        return PodVerdict("ready")
    for cs in status.container_statuses or []:
        if cs.state and cs.state.waiting is not None and cs.state.waiting.reason:
            return PodVerdict("provisioning", cs.state.waiting.reason, cs.state.waiting.message or "")
    return PodVerdict("provisioning", "NotReady" if status.phase == "Running" else (status.phase or "Pending"))


def _terminated_reason(status: Any) -> str:
    for cs in status.container_statuses or []:
        if cs.state and cs.state.terminated is not None:
            code = cs.state.terminated.exit_code
            return f"{cs.state.terminated.reason or 'Exited'}({code})"
    return ""


def pod_manifest(spec: SandboxSpec, *, config: KubeSandboxConfig, owner: dict[str, Any] | None) -> dict[str, Any]:
    """The Pod for `spec`. Pure (no API calls), so tests can read the shape without a cluster."""
    obj = object_name(spec.name)
    cpu = spec.cpu if spec.cpu is not None else config.default_cpu
    memory = spec.memory_mb if spec.memory_mb is not None else config.default_memory_mb
    resources: dict[str, str] = {"cpu": f"{int(round(cpu * 1000))}m", "memory": f"{memory}Mi"}
    workspace_volume: dict[str, Any] = {"name": "workspace", "emptyDir": {}}
    if spec.disk_mb is not None:
        resources["ephemeral-storage"] = f"{spec.disk_mb + config.tmp_size_mb}Mi"
        workspace_volume["emptyDir"] = {"sizeLimit": f"{spec.disk_mb}Mi"}
    container = {
        "name": CONTAINER,
        "image": spec.image or config.default_image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(config.agent_command),
        "args": agent_args(config),
        "workingDir": config.workspace,
        "ports": [{"name": "agent", "containerPort": config.agent_port, "protocol": "TCP"}],
        "env": [{"name": key, "value": value} for key, value in sorted(spec.env.items())],
        # Requests = limits: Guaranteed QoS, so a busy neighbour cannot squeeze a rollout mid-episode.
        "resources": {"requests": resources, "limits": dict(resources)},
        "readinessProbe": {"tcpSocket": {"port": "agent"}, "periodSeconds": 1, "failureThreshold": 3},
        # The agent's own user: 0 with only what switching its children to run_as_user and killing their
        # process groups takes (agent_args passes --run-as); commands then hold no capability at all.
        "securityContext": {
            "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
            "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(AGENT_CAPABILITIES)},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": config.workspace},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "agent-secret", "mountPath": SECRET_MOUNT, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no env vars describing the cluster's Services
        "terminationGracePeriodSeconds": config.delete_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": config.run_as_user, "runAsGroup": config.run_as_user,
            "fsGroup": config.run_as_user,  # the workspace and /tmp belong to the commands' group
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            workspace_volume,
            {"name": "tmp", "emptyDir": {"sizeLimit": f"{config.tmp_size_mb}Mi"}},
            {"name": "agent-secret", "secret": {"secretName": secret_name(obj), "defaultMode": 0o400}},
        ],
    }
    if config.runtime_class_name:
        pod_spec["runtimeClassName"] = config.runtime_class_name
    if config.node_selector:
        pod_spec["nodeSelector"] = dict(config.node_selector)
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in config.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(obj, spec, owner),
        "spec": pod_spec,
    }


def agent_args(config: KubeSandboxConfig) -> list[str]:
    # 0.0.0.0 inside the pod's network namespace: the pod IP (and its loopback), nothing else.
    return [
        "--listen", f"tcp:0.0.0.0:{config.agent_port}",
        "--secret-file", f"{SECRET_MOUNT}/{SECRET_KEY}",
        "--run-as", f"{config.run_as_user}:{config.run_as_user}",
        "--workspace", config.workspace,
    ]


def _metadata(obj: str, spec: SandboxSpec, owner: dict[str, Any] | None) -> dict[str, Any]:
    labels = {**spec.labels, LABEL_SANDBOX: obj, LABEL_MANAGED_BY: "trove", LABEL_NETWORK: spec.network}
    meta: dict[str, Any] = {"name": obj, "labels": labels, "annotations": {ANNOTATION_NAME: spec.name}}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def _counted(counter: Callable[[str], None], fn: Callable[..., T]) -> Callable[..., T]:
    # functools.wraps keeps the signature and docstring, from which kubernetes.watch learns the item type.
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        counter(fn.__name__)
        return fn(*args, **kwargs)

    return call


class KubernetesBackend(SandboxBackend):
    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "trove-sandboxes",
        kubeconfig: str | None = None,
        api_client: k8s.ApiClient | None = None,
        config: KubeSandboxConfig | None = None,
        request_timeout: float = 30.0,
    ) -> None:
        self.config = replace(config or KubeSandboxConfig(), namespace=namespace)
        self.namespace = namespace
        self.request_timeout = request_timeout
        self._client = api_client or _load_api_client(kubeconfig)
        self._core = k8s.CoreV1Api(self._client)
        self._net = k8s.NetworkingV1Api(self._client)
        self._fleet_uids: dict[str, str] = {}
        self._lock = threading.Lock()
        self._fleet_lock = threading.Lock()
        self.api_calls = 0  # every request to the API server, watches included (read by benchmarks)
        self.api_calls_by_method: dict[str, int] = {}

    # -- SandboxBackend ----------------------------------------------------------------------------------

    def create(self, spec: SandboxSpec, *, wait: bool = True, timeout: float = 60.0) -> SandboxHandle:
        deadline = time.monotonic() + timeout
        if not (spec.image or self.config.default_image):
            raise SandboxStartFailed(f"sandbox {spec.name}: no image", reason="no_image", permanent=True)
        try:
            owner = self._fleet_owner(spec.labels.get(LABEL_FLEET))
            secret_value = self._ensure_secret(spec, owner)
            pod = self._ensure_pod(spec, owner, deadline)
            if not wait:
                return self._handle(pod, secret_value)
            return self._wait_ready(pod, secret_value, deadline)
        except SandboxStartFailed:
            self._cleanup_after_failure(spec.name)
            raise
        except SandboxError as exc:  # the API server failed us midway (unreachable, refused): same contract
            self._cleanup_after_failure(spec.name)
            raise SandboxStartFailed(str(exc), reason=exc.reason, permanent=exc.permanent) from exc

    def get(self, name: str) -> SandboxHandle:
        obj = object_name(name)
        try:
            pod = self._call(self._core.read_namespaced_pod, obj, self.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                raise SandboxNotFound(f"no pod {self.namespace}/{obj}", reason="not_found") from exc
            raise self._error(exc, f"get {obj}") from exc
        return self._handle(pod, self._read_secret(obj))

    def list(self, labels: dict[str, str]) -> list[SandboxHandle]:
        selector = label_selector(labels)
        pods = self._api(self._core.list_namespaced_pod, self.namespace, label_selector=selector, what="list pods")
        found = self._api(self._core.list_namespaced_secret, self.namespace, label_selector=selector, what="list secrets")
        by_name = {s.metadata.name: _secret_value(s) for s in found.items}
        return [self._handle(pod, by_name.get(secret_name(pod.metadata.name), "")) for pod in pods.items]

    def exec(
        self,
        handle: SandboxHandle,
        cmd: str,
        *,
        timeout: float = 60.0,
        idle_timeout: float | None = None,
        max_output: int = 64 * 1024,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        before_send: Callable[[], None] | None = None,
    ) -> ExecResult:
        return self._agent(handle).exec(cmd, timeout=timeout, idle_timeout=idle_timeout, max_output=max_output,
                                        cwd=cwd, env=env, before_send=before_send)

    def read_file(self, handle: SandboxHandle, path: str) -> bytes:
        return self._agent(handle).read_file(path)

    def write_file(self, handle: SandboxHandle, path: str, content: bytes, *,
                   before_send: Callable[[], None] | None = None) -> None:
        self._agent(handle).write_file(path, content, before_send=before_send)

    def write_files(self, handle: SandboxHandle, files: dict[str, bytes], *,
                    before_send: Callable[[], None] | None = None) -> None:
        self._agent(handle).write_files(files, before_send=before_send)

    def destroy(self, name: str) -> None:
        """Delete the pod, then its secret. Idempotent. Returns once the API server has accepted the
        deletes; the pod may stay `terminating` for its grace period."""
        obj = object_name(name)
        self._delete(self._core.delete_namespaced_pod, obj, grace=self.config.delete_grace_seconds)
        self._delete(self._core.delete_namespaced_secret, secret_name(obj))

    # -- fleets ------------------------------------------------------------------------------------------

    def ensure_fleet(self, fleet: str) -> str:
        """Create (or find) the ConfigMap standing for `fleet`; return its uid. Its dependents cascade."""
        with self._lock:
            if fleet in self._fleet_uids:
                return self._fleet_uids[fleet]
        # One creator at a time, so a burst of creates for a new fleet makes one call, not one each.
        with self._fleet_lock:
            with self._lock:
                if fleet in self._fleet_uids:
                    return self._fleet_uids[fleet]
            return self._create_fleet(fleet)

    def _create_fleet(self, fleet: str) -> str:
        name = fleet_object_name(fleet)
        body = {"metadata": {"name": name, "labels": {LABEL_FLEET: fleet, LABEL_MANAGED_BY: "trove"}},
                "data": {"fleet": fleet}}
        try:
            made = self._call(self._core.create_namespaced_config_map, self.namespace, body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise self._error(exc, f"create fleet {fleet}", start=True) from exc
            made = self._api(self._core.read_namespaced_config_map, name, self.namespace, what=f"read fleet {fleet}")
        with self._lock:
            self._fleet_uids[fleet] = made.metadata.uid
        return str(made.metadata.uid)

    def delete_fleet(self, fleet: str) -> None:
        """Delete the fleet's ConfigMap; the garbage collector then removes the pods, secrets and
        NetworkPolicy it owns. Idempotent."""
        with self._lock:
            self._fleet_uids.pop(fleet, None)
        self._delete(self._core.delete_namespaced_config_map, fleet_object_name(fleet), propagation="Background")

    def ensure_fleet_policy(
        self,
        fleet: str,
        *,
        network: str = "proxy-only",
        proxy_cidr: str | None = None,
        proxy_port: int = 8001,
        proxy_pod_labels: dict[str, str] | None = None,
        proxy_namespace_labels: dict[str, str] | None = None,
        allow_dns: bool = True,
    ) -> dict[str, Any]:
        """Create or update the fleet's NetworkPolicy: ingress only to the agent port from the agent's
        clients; egress nothing (`none`) or only the proxy (`proxy-only`), addressed by CIDR or by pod /
        namespace labels (then DNS to kube-dns is allowed too, to resolve its Service). Returns the
        manifest applied."""
        body = network_policy_manifest(
            fleet, config=self.config, network=network, proxy_cidr=proxy_cidr, proxy_port=proxy_port,
            proxy_pod_labels=proxy_pod_labels, proxy_namespace_labels=proxy_namespace_labels, allow_dns=allow_dns,
            owner=self._fleet_owner(fleet),
        )
        name = body["metadata"]["name"]
        try:
            self._call(self._net.create_namespaced_network_policy, self.namespace, body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise self._error(exc, f"create network policy {name}") from exc
            self._api(self._net.patch_namespaced_network_policy, name, self.namespace, body, what=f"patch {name}")
        return body

    # -- watch -------------------------------------------------------------------------------------------

    def watch_sandboxes(
        self,
        labels: dict[str, str],
        callback: Callable[[SandboxObservation], None],
        stop_event: threading.Event,
        *,
        poll_seconds: int = 2,
    ) -> None:
        """Stream observations of the sandboxes matching `labels` until `stop_event` is set: every one
        present at the start (added), then each change of state/reason/endpoint and each deletion. A
        lost watch relists and reports what changed in the gap, deletions included. Blocks; run it in a
        thread. Handles carry no secret (use get()). Callback errors are logged, not raised."""
        known: dict[str, SandboxHandle] = {}
        while not stop_event.is_set():
            try:
                resource_version = self._relist(labels, known, callback)
                self._watch_changes(labels, known, callback, stop_event, resource_version, poll_seconds)
            except WatchExpired:
                continue  # the relist reports what changed in the gap, deletions included
            except SandboxError as exc:
                log.warning("sandbox watch: %s; relisting", exc)
                stop_event.wait(1.0)

    def _relist(self, labels: dict[str, str], known: dict[str, SandboxHandle],
                callback: Callable[[SandboxObservation], None]) -> str:
        listing = self._api(self._core.list_namespaced_pod, self.namespace, label_selector=label_selector(labels),
                            what="list pods")
        current = {pod.metadata.name: self._handle(pod, "") for pod in listing.items}
        for name in set(known) - set(current):
            _notify(callback, SandboxObservation("deleted", replace(known.pop(name), state="gone")))
        for name, handle in current.items():
            previous = known.get(name)
            if previous is None or _changed(previous, handle):
                known[name] = handle
                _notify(callback, SandboxObservation("added" if previous is None else "modified", handle))
        return str(listing.metadata.resource_version)

    def _watch_changes(self, labels: dict[str, str], known: dict[str, SandboxHandle],
                       callback: Callable[[SandboxObservation], None], stop_event: threading.Event,
                       resource_version: str, poll_seconds: int) -> None:
        selector = label_selector(labels)
        while not stop_event.is_set():
            for kind, pod in self._pod_events(selector, resource_version, time.monotonic() + poll_seconds):
                resource_version = pod.metadata.resource_version
                name = pod.metadata.name
                if kind == "DELETED":
                    handle = replace(self._handle(pod, ""), state="gone")
                    known.pop(name, None)
                    _notify(callback, SandboxObservation("deleted", handle, resource_version))
                    continue
                handle = self._handle(pod, "")
                previous = known.get(name)
                if previous is None or _changed(previous, handle):
                    known[name] = handle
                    _notify(callback, SandboxObservation("added" if previous is None else "modified", handle,
                                                         resource_version))
                if stop_event.is_set():
                    return

    # -- create, step by step ------------------------------------------------------------------------------

    def _fleet_owner(self, fleet: str | None) -> dict[str, Any] | None:
        if not fleet or not self.config.owner_references:
            return None
        uid = self.ensure_fleet(fleet)
        # No blockOwnerDeletion: setting it needs update rights on the owner, which the backend lacks.
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": fleet_object_name(fleet), "uid": uid}

    def _ensure_secret(self, spec: SandboxSpec, owner: dict[str, Any] | None) -> str:
        """Create the agent secret, or read the one an earlier attempt made (the pod mounts it by name,
        so a retried create must hand out the same value)."""
        obj = object_name(spec.name)
        value = secrets_module.token_urlsafe(32)
        meta = _metadata(secret_name(obj), spec, owner)
        meta["labels"][LABEL_SANDBOX] = obj
        body = {"metadata": meta, "type": "Opaque", "stringData": {SECRET_KEY: value}}
        try:
            self._call(self._core.create_namespaced_secret, self.namespace, body)
            return value
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise self._error(exc, f"create secret for {obj}", start=True) from exc
        existing = self._read_secret(obj)
        if not existing:  # deleted between our create and read: a destroy raced us
            raise SandboxStartFailed(f"secret for {obj} vanished during create", reason="conflict")
        return existing

    def _ensure_pod(self, spec: SandboxSpec, owner: dict[str, Any] | None, deadline: float) -> Pod:
        obj = object_name(spec.name)
        manifest = pod_manifest(spec, config=self.config, owner=owner)
        while True:
            if time.monotonic() > deadline:
                raise SandboxStartFailed(f"pod {obj} kept conflicting with an older one", reason="conflict")
            try:
                return self._call(self._core.create_namespaced_pod, self.namespace, manifest)
            except k8s.ApiException as exc:
                if exc.status != 409:
                    raise self._error(exc, f"create pod {obj}", start=True) from exc
            existing = self._read_pod(obj)
            if existing is None:
                continue  # deleted between the conflict and our read: try again
            if existing.metadata.deletion_timestamp is None:
                return existing  # a retried create: adopt it
            # A previous incarnation (a failed attempt we cleaned up) is still terminating.
            self._wait_gone(obj, existing, deadline)

    def _wait_gone(self, obj: str, pod: Pod, deadline: float) -> None:
        for kind, _ in self._follow_pod(pod, deadline):
            if kind == "DELETED":
                return
        if self._read_pod(obj) is not None:
            raise SandboxStartFailed(f"previous pod {obj} still terminating", reason="terminating")

    def _wait_ready(self, pod: Pod, secret_value: str, deadline: float) -> SandboxHandle:
        obj = pod.metadata.name
        verdict = self._check_start(pod)
        if verdict.state != "ready":
            for kind, event_pod in self._follow_pod(pod, deadline):
                if kind == "DELETED":
                    raise SandboxStartFailed(f"pod {obj} was deleted while starting", reason="deleted")
                pod, verdict = event_pod, self._check_start(event_pod)
                if verdict.state == "ready":
                    break
        if verdict.state != "ready":
            reason = verdict.reason if verdict.reason == "Unschedulable" else "timeout"
            raise SandboxStartFailed(f"pod {obj} not ready in time ({verdict.reason}: {verdict.message})",
                                     reason=reason)
        handle = self._handle(pod, secret_value)
        self._wait_agent(handle, deadline)
        return handle

    @staticmethod
    def _check_start(pod: Pod) -> PodVerdict:
        verdict = observe_pod(pod)
        if verdict.state == "failed":
            raise SandboxStartFailed(f"pod {pod.metadata.name} failed: {verdict.reason} {verdict.message}".strip(),
                                     reason=verdict.reason, permanent=verdict.permanent)
        if verdict.state == "terminating":
            raise SandboxStartFailed(f"pod {pod.metadata.name} is terminating", reason="terminating")
        return verdict

    def _wait_agent(self, handle: SandboxHandle, deadline: float) -> None:
        """Ready means the port accepts connections; this also proves the agent speaks and has our secret."""
        agent = self._agent(handle)
        pause = 0.05
        while True:
            try:
                agent.ping(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                return
            except AgentAuthError as exc:
                raise SandboxStartFailed(f"agent of {handle.name} refused its secret", reason="agent_auth",
                                         permanent=True) from exc
            except AgentUnavailable as exc:
                if time.monotonic() + pause > deadline:
                    raise SandboxStartFailed(f"agent of {handle.name} did not answer: {exc}",
                                             reason="agent_unavailable") from exc
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _cleanup_after_failure(self, name: str) -> None:
        try:
            self.destroy(name)
        except SandboxError:
            log.exception("could not clean up sandbox %s after a failed create", name)

    # -- helpers -----------------------------------------------------------------------------------------

    def _pod_events(self, selector: str, resource_version: str, deadline: float, *,
                    field_selector: str | None = None) -> Iterator[tuple[str, Pod]]:
        """Watch events for pods matching the selectors after `resource_version`, until `deadline`.
        Re-opens a watch the server closed. Raises WatchExpired when `resource_version` is too old
        (410 Gone): the caller relists, since what happened in between is lost."""
        listing_kw: dict[str, Any] = {}
        if selector:
            listing_kw["label_selector"] = selector
        if field_selector:
            listing_kw["field_selector"] = field_selector
        while (remaining := deadline - time.monotonic()) > 0:
            stream = k8s_watch.Watch()
            try:
                for event in stream.stream(
                    _counted(self._count, self._core.list_namespaced_pod), self.namespace,
                    resource_version=resource_version, timeout_seconds=max(1, int(remaining + 0.999)),
                    _request_timeout=remaining + 10, **listing_kw,
                ):
                    if event["type"] == "ERROR":  # a Status in the stream, e.g. 410 Gone: handled below
                        status = event.get("raw_object") or {}
                        raise k8s.ApiException(status=status.get("code", 500), reason=status.get("reason", ""))
                    if event["type"] == "BOOKMARK":
                        continue
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    yield event["type"], pod
                    if time.monotonic() >= deadline:
                        return
            except k8s.ApiException as exc:
                if exc.status == 410:
                    raise WatchExpired(resource_version) from exc
                raise self._error(exc, "watch pods") from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                log.warning("pod watch dropped (%s); reopening", exc)
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            finally:
                stream.stop()

    def _follow_pod(self, pod: Pod, deadline: float) -> Iterator[tuple[str, Pod]]:
        """Changes to one pod until `deadline`; ends after its DELETED. Survives an expired watch by
        reading the pod afresh (a pod that vanished meanwhile is reported DELETED)."""
        obj, resource_version = pod.metadata.name, pod.metadata.resource_version
        while time.monotonic() < deadline:
            try:
                for kind, event_pod in self._pod_events("", resource_version, deadline,
                                                        field_selector=f"metadata.name={obj}"):
                    resource_version = event_pod.metadata.resource_version
                    yield kind, event_pod
                    if kind == "DELETED":
                        return
                return
            except WatchExpired:
                current = self._read_pod(obj)
                if current is None or current.metadata.uid != pod.metadata.uid:
                    yield "DELETED", pod
                    return
                resource_version = current.metadata.resource_version
                yield "MODIFIED", current

    def _handle(self, pod: Pod, secret_value: str) -> SandboxHandle:
        verdict = observe_pod(pod)
        pod_ip = pod.status.pod_ip if pod.status else None
        annotations = pod.metadata.annotations or {}
        return SandboxHandle(
            name=annotations.get(ANNOTATION_NAME, pod.metadata.name),
            state=verdict.state,
            endpoint=f"tcp:{pod_ip}:{self.config.agent_port}" if pod_ip and verdict.state == "ready" else "",
            secret=secret_value,
            labels=dict(pod.metadata.labels or {}),
            reason=verdict.reason,
            details={
                "namespace": pod.metadata.namespace, "pod": pod.metadata.name, "uid": pod.metadata.uid,
                "node": pod.spec.node_name if pod.spec else None, "phase": pod.status.phase if pod.status else None,
                "pod_ip": pod_ip, "message": verdict.message, "permanent": verdict.permanent,
            },
        )

    def _agent(self, handle: SandboxHandle) -> AgentClient:
        if not handle.endpoint:
            raise AgentUnavailable(f"sandbox {handle.name} has no agent endpoint (state {handle.state})",
                                   reason="not_ready")
        return AgentClient(handle.endpoint, handle.secret)

    def _read_pod(self, obj: str) -> Pod | None:
        try:
            return self._call(self._core.read_namespaced_pod, obj, self.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise self._error(exc, f"read pod {obj}") from exc

    def _read_secret(self, obj: str) -> str:
        try:
            return _secret_value(self._call(self._core.read_namespaced_secret, secret_name(obj), self.namespace))
        except k8s.ApiException as exc:
            if exc.status == 404:
                return ""
            raise self._error(exc, f"read secret {obj}") from exc

    def _delete(self, method: Callable[..., Any], name: str, *, grace: int | None = None,
                propagation: str = "Background") -> None:
        kwargs: dict[str, Any] = {"propagation_policy": propagation}
        if grace is not None:
            kwargs["grace_period_seconds"] = grace
        try:
            self._call(method, name, self.namespace, **kwargs)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, f"delete {name}") from exc

    def _count(self, method: str) -> None:
        with self._lock:
            self.api_calls += 1
            self.api_calls_by_method[method] = self.api_calls_by_method.get(method, 0) + 1

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API request, counted. ApiException passes through for the caller to interpret; transport
        failures become a transient SandboxError."""
        self._count(method.__name__)
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            return method(*args, **kwargs)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SandboxError(f"API server unreachable: {exc}", reason="api_unavailable") from exc

    def _api(self, method: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
        try:
            return self._call(method, *args, **kwargs)
        except k8s.ApiException as exc:
            raise self._error(exc, what) from exc

    def _error(self, exc: k8s.ApiException, what: str, *, start: bool = False) -> SandboxError:
        reason, permanent = classify_api_error(exc)
        cls = SandboxStartFailed if start else SandboxError
        return cls(f"{what}: {exc.status} {exc.reason}: {_status_message(exc)}", reason=reason, permanent=permanent)


def classify_api_error(exc: k8s.ApiException) -> tuple[str, bool]:
    """(reason, permanent) for an API error. An exceeded quota frees up as sandboxes end: transient."""
    status = exc.status or 0
    message = _status_message(exc)
    if status == 403 and "exceeded quota" in message:
        return "quota", False
    if status in (401, 403):
        return ("unauthorized" if status == 401 else "forbidden"), True
    if status in (400, 422):
        return "invalid", True
    if status == 404:
        return "not_found", True
    if status == 409:
        return "conflict", False
    return "api_unavailable", False  # 429, 5xx, timeouts


def _status_message(exc: k8s.ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message", "")) or str(exc.body or "")
    except ValueError:
        return str(exc.body or "")


def _secret_value(secret: Any) -> str:
    raw = (secret.data or {}).get(SECRET_KEY)
    if raw is None:
        return ""
    if isinstance(raw, bytes):
        raw = raw.decode()
    return base64.b64decode(raw).decode()


def _changed(before: SandboxHandle, after: SandboxHandle) -> bool:
    return (before.state, before.reason, before.endpoint) != (after.state, after.reason, after.endpoint)


def _notify(callback: Callable[[SandboxObservation], None], observation: SandboxObservation) -> None:
    try:
        callback(observation)
    except Exception:
        log.exception("sandbox watch callback failed on %s %s", observation.kind, observation.handle.name)


def network_policy_manifest(
    fleet: str,
    *,
    config: KubeSandboxConfig,
    network: str,
    proxy_cidr: str | None,
    proxy_port: int,
    proxy_pod_labels: dict[str, str] | None,
    proxy_namespace_labels: dict[str, str] | None,
    allow_dns: bool,
    owner: dict[str, Any] | None,
) -> dict[str, Any]:
    if network not in ("none", "proxy-only"):
        raise SandboxError(f"network mode {network!r} has no Kubernetes policy yet", reason="invalid", permanent=True)
    egress: list[dict[str, Any]] = []
    if network == "proxy-only":
        if proxy_cidr:
            peer: dict[str, Any] = {"ipBlock": {"cidr": proxy_cidr}}
        elif proxy_pod_labels is not None:
            peer = {"podSelector": {"matchLabels": dict(proxy_pod_labels)}}
            if proxy_namespace_labels is not None:
                peer["namespaceSelector"] = {"matchLabels": dict(proxy_namespace_labels)}
        else:
            raise SandboxError("proxy-only needs proxy_cidr or proxy_pod_labels", reason="invalid", permanent=True)
        egress.append({"to": [peer], "ports": [{"protocol": "TCP", "port": proxy_port}]})
        if allow_dns and not proxy_cidr:
            egress.append({
                "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            })
    client_peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": dict(config.agent_client_namespace_labels)}}
    if config.agent_client_pod_labels:
        client_peer["podSelector"] = {"matchLabels": dict(config.agent_client_pod_labels)}
    meta: dict[str, Any] = {
        "name": object_name(f"trove-fleet-{fleet}-net"),
        "labels": {LABEL_FLEET: fleet, LABEL_MANAGED_BY: "trove"},
    }
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": {LABEL_FLEET: fleet}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [client_peer], "ports": [{"protocol": "TCP", "port": config.agent_port}]}],
            "egress": egress,
        },
    }


def _load_api_client(kubeconfig: str | None) -> k8s.ApiClient:
    """KUBECONFIG-style file if given, else the in-cluster service account, else ~/.kube/config."""
    configuration = k8s.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    # Creates run concurrently from many worker threads; the default pool of 4 would serialize them.
    configuration.connection_pool_maxsize = 64
    return k8s.ApiClient(configuration)
