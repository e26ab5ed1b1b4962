"""A test kubelet (kwok-style) that makes pods on the loopback apiserver real enough for the sandbox lifecycle.

It plays the two missing control-plane parts for one Node:
- scheduler: binds each pending pod to the node (`create_namespaced_binding`), or marks it
  PodScheduled=False/Unschedulable when its requests do not fit or its nodeSelector does not match;
- kubelet: for each pod bound to the node it "runs" the first container as a local process and reports
  status back like a kubelet does (phase, podIP, conditions, container states).

What "running a container" means here, so the pod spec alone decides what runs:
- each pod gets its own loopback pod IP (127.B.x.y, B random per kubelet so parallel runs do not collide);
  "0.0.0.0" in the container's command/args (listen on all of the pod's interfaces) becomes that IP;
- the process runs as the securityContext's runAsUser/runAsGroup with fsGroup as a supplementary group
  when the kubelet runs as root (a runAsNonRoot pod without a uid fails as CreateContainerConfigError);
- emptyDir and secret volumes become per-pod host directories; container paths under a volume mount, or
  under a path of the "image" given in `image_files` (e.g. /opt/trove -> the repo's workers/sandboxes),
  are rewritten to the host path; `python3` runs as this interpreter;
- env: `value` and `valueFrom.secretKeyRef` (read from the API, as a kubelet does);
- readiness: a tcpSocket readinessProbe is polled at podIP:port before the pod is reported Ready;
- an image whose registry host ends in ".invalid" cannot be pulled: the pod stays Pending with the
  container waiting in ErrImagePull, then ImagePullBackOff;
- a process that exits is reported as a terminated container (pod phase Failed, restartPolicy Never);
- a pod being deleted (deletionTimestamp set) has its process group killed and is then deleted with grace
  period 0, as a kubelet confirms termination; a pod that vanishes has its process killed too.

Run in a thread of the test process: `start()` / `stop()`, or `with TestKubelet(...)`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.utils.quantity import parse_quantity

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the sandbox image holds, for this kubelet: the agent at /opt/trove/agent.py (see deploy/README.md).
DEFAULT_IMAGE_FILES = {"/opt/trove": REPO_ROOT / "workers" / "sandboxes"}
DEFAULT_CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "1Ti"}
# The agent is stdlib-only; the system interpreter is reachable by any uid (a pyenv one under /root is not).
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
AS_ROOT = os.geteuid() == 0
READINESS_TIMEOUT = 30.0
KUBELET_MARKER = "TROVE_TEST_KUBELET"
POD_MARKER = "TROVE_TEST_POD"
# kubernetes.client.V1Pod; Any because every field of the generated models is Optional.
Pod = Any
SECRET_WAIT = 20.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ip_sequence() -> Iterator[str]:
    # A random start, so two test sessions on one machine (each with its own kubelet) do not hand out the
    # same pod IP and collide on the agent port.
    second = random.randint(16, 250)
    for n in itertools.count(random.randint(2, 50000)):
        if n & 255 in (0, 1, 255):
            continue
        yield f"127.{second}.{(n >> 8) & 255}.{n & 255}"


@dataclass
class PodRun:
    """One pod this kubelet runs. `lock` serializes start and termination of the same pod."""

    uid: str
    namespace: str
    name: str
    ip: str
    dir: Path
    requests: dict[str, Decimal]
    proc: subprocess.Popen[bytes] | None = None
    deleting: bool = False
    reported_exit: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class TestKubelet:
    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        node_name: str = "trove-test-node",
        namespace: str | None = None,
        image_files: dict[str, Path] | None = None,
        capacity: dict[str, str] | None = None,
        workdir: Path | None = None,
        max_workers: int = 32,
    ) -> None:
        self.api = k8s.CoreV1Api(api_client)
        self.node_name = node_name
        self.namespace = namespace
        self.image_files = dict(image_files or DEFAULT_IMAGE_FILES)
        self.capacity = dict(capacity or DEFAULT_CAPACITY)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="trove-kubelet-"))
        self._ips = _ip_sequence()
        self._pods: dict[str, PodRun] = {}
        self._seen_unbound: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._unpaused = threading.Event()
        self._unpaused.set()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kubelet")
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []  # unexpected failures, for tests to assert on
        self._id = uuid.uuid4().hex

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> TestKubelet:
        self._unpack_image()
        self._register_node()
        for target, name in ((self._watch_loop, "kubelet-watch"), (self._monitor_loop, "kubelet-monitor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, *, delete_node: bool = True) -> None:
        self._stop.set()
        self._unpaused.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            runs = list(self._pods.values())
            self._pods.clear()
        for run in runs:
            self._kill(run)
        if delete_node:
            with contextlib.suppress(k8s.ApiException):
                self.api.delete_node(self.node_name)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold pod starts (as a slow image pull would) until the block ends."""
        self._unpaused.clear()
        try:
            yield
        finally:
            self._unpaused.set()

    def live_processes(self) -> int:
        """Processes of this kubelet's pods still alive: agents and whatever they started."""
        return len(self.pod_processes())

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        with self._lock:
            for run in self._pods.values():
                if (run.namespace, run.name) == (namespace, name):
                    return run.dir
        return None

    def _unpack_image(self) -> None:
        """Copy the "image" files into the kubelet's own world-readable dir: the pods' processes may run as
        another uid, which cannot be assumed to read the repository where it lives (e.g. under /root)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)
        unpacked: dict[str, Path] = {}
        for index, (container_path, source) in enumerate(sorted(self.image_files.items())):
            target = self.workdir / "image" / str(index)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            for path in [target.parent, target, *target.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
            unpacked[container_path] = target
        self.image_files = unpacked

    # -- node --------------------------------------------------------------------------------------------

    def _register_node(self) -> None:
        body = k8s.V1Node(metadata=k8s.V1ObjectMeta(name=self.node_name, labels=self._node_labels()))
        try:
            self.api.create_node(body)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
        self.api.patch_node_status(self.node_name, {"status": self._node_status()})
        # TaintNodesByCondition admission taints a new node not-ready; the node lifecycle controller would
        # lift it once the node reports Ready. There is no such controller here, so lift it ourselves.
        self.api.patch_node(self.node_name, {"spec": {"taints": None}})

    def _node_status(self) -> dict[str, Any]:
        now = _now()
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node_name}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test kubelet is posting ready status",
                 "lastHeartbeatTime": now, "lastTransitionTime": now},
            ],
            "nodeInfo": {
                "machineID": "trove-test", "systemUUID": "trove-test", "bootID": "trove-test",
                "kernelVersion": os.uname().release, "osImage": "loopback", "containerRuntimeVersion": "trove-test://1",
                "kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    # -- event loop ------------------------------------------------------------------------------------

    def _list(self) -> Any:
        # The API method itself, not a wrapper: kubernetes.watch reads the item type from its signature.
        if self.namespace:
            return functools.partial(self.api.list_namespaced_pod, self.namespace)
        return self.api.list_pod_for_all_namespaces

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self._list()()
                self._resync(listing.items)
                self._watch_from(listing.metadata.resource_version)
            except Exception as exc:  # keep the kubelet alive through apiserver hiccups, but record them
                if self._stop.is_set():
                    return
                self.errors.append(f"watch: {exc!r}")
                log.exception("test kubelet watch failed; relisting")
                time.sleep(0.5)

    def _watch_from(self, resource_version: str) -> None:
        w = watch.Watch()
        while not self._stop.is_set():
            try:
                for event in w.stream(self._list(), resource_version=resource_version, timeout_seconds=1,
                                      allow_watch_bookmarks=True):
                    kind, raw = event["type"], event.get("raw_object") or {}
                    if kind == "ERROR":  # e.g. 410 Gone inside the stream: relist
                        return
                    if kind == "BOOKMARK":
                        resource_version = raw.get("metadata", {}).get("resourceVersion", resource_version)
                        continue
                    obj = event["object"]
                    resource_version = obj.metadata.resource_version
                    self._on_event(kind, obj)
                    if self._stop.is_set():
                        return
            except k8s.ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: relist
                    return
                raise

    def _resync(self, pods: list[Pod]) -> None:
        present = {pod.metadata.uid for pod in pods}
        with self._lock:
            vanished = [run for uid, run in self._pods.items() if uid not in present]
        for run in vanished:
            self._pool.submit(self._forget, run.uid)
        for pod in pods:
            self._on_event("ADDED", pod)

    def _on_event(self, kind: str, pod: Pod) -> None:
        uid = pod.metadata.uid
        if kind == "DELETED":
            self._pool.submit(self._forget, uid)
            return
        node = pod.spec.node_name
        if pod.metadata.deletion_timestamp is not None:
            if node == self.node_name:
                self._pool.submit(self._terminate, pod)
            return
        if not node:
            with self._lock:
                if uid in self._seen_unbound:
                    return
                self._seen_unbound.add(uid)
            self._pool.submit(self._schedule, pod)
            return
        if node != self.node_name or pod.status.phase in ("Succeeded", "Failed"):
            return
        with self._lock:
            if uid in self._pods:
                return
            run = PodRun(uid=uid, namespace=pod.metadata.namespace, name=pod.metadata.name, ip=next(self._ips),
                         dir=self.workdir / uid, requests=_pod_requests(pod))
            self._pods[uid] = run
        self._pool.submit(self._start, run, pod)

    # -- scheduler -------------------------------------------------------------------------------------

    def _schedule(self, pod: Pod) -> None:
        why = self._unfit_reason(pod)
        ns, name = pod.metadata.namespace, pod.metadata.name
        if why:
            self._patch_status(ns, name, {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": f"0/1 nodes are available: 1 {why}.", "lastTransitionTime": _now()}]})
            return
        binding = k8s.V1Binding(metadata=k8s.V1ObjectMeta(name=name, uid=pod.metadata.uid),
                                target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name))
        try:
            # The response is a Status, which the generated client cannot read as a Binding: take it raw,
            # and read it so the connection goes back to the pool.
            response: Any = self.api.create_namespaced_binding(ns, binding, _preload_content=False)
            response.read()
            response.release_conn()
        except k8s.ApiException as exc:
            if exc.status not in (404, 409):  # deleted meanwhile, or already bound
                self.errors.append(f"bind {ns}/{name}: {exc.status} {exc.reason}")

    def _unfit_reason(self, pod: Pod) -> str:
        selector = pod.spec.node_selector or {}
        if any(self._node_labels().get(k) != v for k, v in selector.items()):
            return "node(s) didn't match node selector"
        wanted = _pod_requests(pod)
        with self._lock:
            used: dict[str, Decimal] = {}
            for run in self._pods.values():
                for key, qty in run.requests.items():
                    used[key] = used.get(key, Decimal(0)) + qty
            pod_count = len(self._pods)
        if pod_count + 1 > parse_quantity(self.capacity["pods"]):
            return "Too many pods"
        for key, qty in wanted.items():
            if key in self.capacity and used.get(key, Decimal(0)) + qty > parse_quantity(self.capacity[key]):
                return f"Insufficient {key}"
        return ""

    def _node_labels(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": self.node_name}

    # -- running pods ----------------------------------------------------------------------------------

    def _start(self, run: PodRun, pod: Pod) -> None:
        self._unpaused.wait()
        with run.lock:
            if run.deleting or self._stop.is_set():
                return
            try:
                self._start_locked(run, pod)
            except Exception as exc:
                self.errors.append(f"start {run.namespace}/{run.name}: {exc!r}")
                log.exception("test kubelet could not start %s/%s", run.namespace, run.name)

    def _start_locked(self, run: PodRun, pod: Pod) -> None:
        container = pod.spec.containers[0]
        if _unpullable(container.image):
            self._report_unpullable(run, container)
            return
        run.dir.mkdir(parents=True, exist_ok=True)
        mounts = self._prepare_volumes(run, pod, container)
        if mounts is None:
            return  # a referenced secret never appeared; reported as CreateContainerConfigError
        env = self._container_env(run, pod, container, mounts)
        if env is None:
            return
        identity = _identity(pod, container)
        if identity.non_root_required and not identity.uid:
            self._patch_status(run.namespace, run.name, {"containerStatuses": [self._container_status(
                container, ready=False, state={"waiting": {"reason": "CreateContainerConfigError",
                                                           "message": "container has runAsNonRoot and image will run as root"}})]})
            return
        argv = [self._host_arg(a, run, mounts) for a in [*(container.command or []), *(container.args or [])]]
        if not argv:  # nothing we know how to run (the image's own entrypoint): a kwok-style stand-in
            self._patch_status(run.namespace, run.name, self._running_status(run, container, ready=True))
            return
        if argv[0] in ("python", "python3"):
            argv[0] = PYTHON
        cwd = self._host_path(container.working_dir, mounts) if container.working_dir else str(run.dir)
        with open(run.dir / "container.log", "wb") as out:
            try:
                run.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            **identity.popen_kwargs())
            except OSError as exc:  # e.g. the command is not in the "image"
                self._patch_status(run.namespace, run.name, {"containerStatuses": [self._container_status(
                    container, ready=False, state={"waiting": {"reason": "RunContainerError", "message": str(exc)}})]})
                return
        ready = self._probe(run, container)
        if run.deleting or self._stop.is_set():
            return
        if run.proc.poll() is None:
            self._patch_status(run.namespace, run.name, self._running_status(run, container, ready=ready))

    def _report_unpullable(self, run: PodRun, container: Any) -> None:
        for reason in ("ErrImagePull", "ImagePullBackOff"):
            message = f'Back-off pulling image "{container.image}"' if reason == "ImagePullBackOff" else (
                f'rpc error: code = Unknown desc = failed to resolve image "{container.image}": no such host')
            self._patch_status(run.namespace, run.name, {
                "phase": "Pending", "hostIP": "127.0.0.1", "podIP": run.ip, "podIPs": [{"ip": run.ip}],
                "startTime": _now(),
                "conditions": self._conditions(ready=False),
                "containerStatuses": [self._container_status(container, ready=False, state={
                    "waiting": {"reason": reason, "message": message}})],
            })
            time.sleep(0.2)

    def _prepare_volumes(self, run: PodRun, pod: Pod, container: Any) -> dict[str, Path] | None:
        """emptyDir: a world-writable directory, as the kubelet makes it. secret: files root-owned with the
        pod's fsGroup as group and `defaultMode` bits (when we are root to set them; else owned by us)."""
        identity = _identity(pod, container)
        for parent in (self.workdir, run.dir):
            parent.chmod(0o755)
        host_dirs: dict[str, Path] = {}
        for volume in pod.spec.volumes or []:
            path = run.dir / "volumes" / volume.name
            path.mkdir(parents=True, exist_ok=True)
            (run.dir / "volumes").chmod(0o755)
            path.chmod(0o755 if volume.secret is not None else 0o777)
            if volume.secret is not None:
                data = self._wait_secret(run, container, pod.metadata.namespace, volume.secret.secret_name)
                if data is None:
                    return None
                mode = volume.secret.default_mode if volume.secret.default_mode is not None else 0o644
                for key, value in data.items():
                    target = path / key
                    target.write_bytes(base64.b64decode(value))
                    if AS_ROOT:
                        os.chown(target, 0, identity.fs_group if identity.fs_group is not None else 0)
                        target.chmod(mode)
                    else:  # the process runs as our uid: the owner bits stand in for the group's
                        target.chmod(((mode | (mode >> 3)) & 0o700) or 0o400)
            host_dirs[volume.name] = path
        return {m.mount_path.rstrip("/") or "/": host_dirs[m.name] for m in container.volume_mounts or []
                if m.name in host_dirs}

    def _container_env(self, run: PodRun, pod: Pod, container: Any,
                       mounts: dict[str, Path]) -> dict[str, str] | None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "HOME": str(mounts.get("/tmp", run.dir)),
               # Inherited by everything the pod starts: how _kill and pod_processes find them all.
               KUBELET_MARKER: self._id, POD_MARKER: run.uid}
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
        for var in container.env or []:
            if var.value_from is not None and var.value_from.secret_key_ref is not None:
                ref = var.value_from.secret_key_ref
                data = self._wait_secret(run, container, pod.metadata.namespace, ref.name)
                if data is None or ref.key not in data:
                    return None
                env[var.name] = base64.b64decode(data[ref.key]).decode()
            elif var.value is not None:
                env[var.name] = self._host_arg(var.value, run, mounts)
        return env

    def _wait_secret(self, run: PodRun, container: Any, namespace: str, name: str) -> dict[str, Any] | None:
        """A kubelet keeps retrying a missing secret; the pod sits in CreateContainerConfigError meanwhile."""
        deadline = time.monotonic() + SECRET_WAIT
        reported = False
        while not (run.deleting or self._stop.is_set()):
            try:
                return self.api.read_namespaced_secret(name, namespace).data or {}
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
            if not reported:
                self._patch_status(run.namespace, run.name, {"containerStatuses": [self._container_status(
                    container, ready=False, state={"waiting": {"reason": "CreateContainerConfigError",
                                                               "message": f'secret "{name}" not found'}})]})
                reported = True
            if time.monotonic() > deadline:
                return None
            time.sleep(0.3)
        return None

    def _host_path(self, path: str, mounts: dict[str, Path]) -> str:
        roots = {**{k: Path(v) for k, v in self.image_files.items()}, **mounts}
        for root in sorted(roots, key=len, reverse=True):
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return str(roots[root]) + path[len(root.rstrip("/")):]
        return path

    def _host_arg(self, arg: str, run: PodRun, mounts: dict[str, Path]) -> str:
        arg = arg.replace("0.0.0.0", run.ip)  # "all of the pod's interfaces" is the pod IP here
        if "=" in arg and not arg.startswith("/"):
            key, _, value = arg.partition("=")
            return f"{key}={self._host_path(value, mounts)}"
        return self._host_path(arg, mounts)

    def _probe(self, run: PodRun, container: Any) -> bool:
        probe = container.readiness_probe
        if probe is None or probe.tcp_socket is None:
            return True
        port = _resolve_port(probe.tcp_socket.port, container)
        deadline = time.monotonic() + READINESS_TIMEOUT
        while time.monotonic() < deadline and not run.deleting and not self._stop.is_set():
            if run.proc is not None and run.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection((run.ip, port), timeout=0.5):
                return True
            time.sleep(0.05)
        return False

    def _running_status(self, run: PodRun, container: Any, *, ready: bool) -> dict[str, Any]:
        started = _now()
        return {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": run.ip, "podIPs": [{"ip": run.ip}], "startTime": started,
            "conditions": self._conditions(ready=ready),
            "containerStatuses": [self._container_status(container, ready=ready, state={"running": {"startedAt": started}},
                                                         container_id=f"trove-test://{run.proc.pid if run.proc else 0}")],
        }

    @staticmethod
    def _conditions(*, ready: bool) -> list[dict[str, str]]:
        now, flag = _now(), "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ]

    @staticmethod
    def _container_status(container: Any, *, ready: bool, state: dict[str, Any],
                          container_id: str | None = None) -> dict[str, Any]:
        status = {"name": container.name, "image": container.image, "imageID": "", "ready": ready,
                  "restartCount": 0, "started": "running" in state, "state": state}
        if container_id:
            status["containerID"] = container_id
        return status

    def _monitor_loop(self) -> None:
        """Report processes that exited on their own (restartPolicy Never: the pod fails)."""
        while not self._stop.wait(0.2):
            with self._lock:
                exited = [run for run in self._pods.values() if run.proc is not None and not run.deleting
                          and not run.reported_exit and run.proc.poll() is not None]
            for run in exited:
                run.reported_exit = True
                code = run.proc.returncode if run.proc else -1
                if code < 0:  # killed by a signal: report it as a container runtime does, 128 + signal
                    code = 128 - code
                reason = "Completed" if code == 0 else "Error"
                self._pool.submit(self._patch_status, run.namespace, run.name, {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "conditions": self._conditions(ready=False),
                    "containerStatuses": [{"name": "sandbox", "image": "", "imageID": "", "ready": False,
                                           "restartCount": 0, "state": {"terminated": {
                                               "exitCode": code, "reason": reason, "finishedAt": _now()}}}],
                })

    def _terminate(self, pod: Pod) -> None:
        uid = pod.metadata.uid
        with self._lock:
            run = self._pods.get(uid)
        if run is not None:
            if run.deleting:
                return
            run.deleting = True
            with run.lock:
                self._kill(run)
        try:
            # With a body the apiserver ignores the query parameters: the grace period goes in the body too.
            self.api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                           body=k8s.V1DeleteOptions(grace_period_seconds=0,
                                                                    preconditions=k8s.V1Preconditions(uid=uid)))
        except k8s.ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or a newer pod of the same name
                self.errors.append(f"delete {pod.metadata.namespace}/{pod.metadata.name}: {exc.status}")

    def _forget(self, uid: str) -> None:
        with self._lock:
            run = self._pods.pop(uid, None)
            self._seen_unbound.discard(uid)
        if run is not None:
            run.deleting = True
            with run.lock:
                self._kill(run)
            shutil.rmtree(run.dir, ignore_errors=True)

    def _kill(self, run: PodRun) -> None:
        """Stop the container as a runtime stops its cgroup: every process of the pod, found by the marker
        in its environment (commands the agent runs have sessions of their own, and background jobs outlive
        their shell and are reparented away from the agent, so neither the process group nor the process
        tree would find them all)."""
        pids = set(self.pod_processes(run.uid))
        if run.proc is not None and run.proc.poll() is None:
            pids.add(run.proc.pid)
        if not pids:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            if run.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.proc.wait(timeout=2 if sig == signal.SIGTERM else 10)
            pids = set(self.pod_processes(run.uid))
            if not pids:
                return

    def pod_processes(self, uid: str | None = None) -> list[int]:
        """Pids of live processes of pod `uid` (default: of any pod of this kubelet)."""
        marker = f"{POD_MARKER}={uid}".encode() if uid else f"{KUBELET_MARKER}={self._id}".encode()
        return _pids_with_env(marker)

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.api.patch_namespaced_pod_status(name, namespace, {"status": status})
        except k8s.ApiException as exc:
            if exc.status != 404:  # deleted while we were reporting on it
                self.errors.append(f"status {namespace}/{name}: {exc.status} {exc.reason}")


def _pids_with_env(marker: bytes) -> list[int]:
    """Processes whose environment holds `marker` ("NAME=value"), zombies excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except (OSError, IndexError):
            continue  # exited while we looked, or not ours to read
        found.append(int(entry))
    return found


@dataclass(frozen=True)
class Identity:
    """Who the container runs as, from the pod and container securityContext (container wins)."""

    uid: int | None
    gid: int | None
    fs_group: int | None
    non_root_required: bool

    def popen_kwargs(self) -> dict[str, Any]:
        # Only root can switch users; otherwise the process runs as us, which is as close as we get.
        if not AS_ROOT or self.uid is None:
            return {}
        groups = [self.fs_group] if self.fs_group is not None else []
        return {"user": self.uid, "group": self.gid if self.gid is not None else self.uid, "extra_groups": groups}


def _identity(pod: Pod, container: Any) -> Identity:
    psc = pod.spec.security_context or k8s.V1PodSecurityContext()
    csc = container.security_context or k8s.V1SecurityContext()

    def pick(name: str) -> Any:
        value = getattr(csc, name, None)
        return value if value is not None else getattr(psc, name, None)

    return Identity(uid=pick("run_as_user"), gid=pick("run_as_group"), fs_group=psc.fs_group,
                    non_root_required=bool(pick("run_as_non_root")))


def _unpullable(image: str | None) -> bool:
    host = (image or "").split("/", 1)[0] if "/" in (image or "") else ""
    return not image or host.endswith(".invalid")


def _resolve_port(port: Any, container: Any) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.ports or []:
        if declared.name == port:
            return int(declared.container_port)
    raise ValueError(f"unknown named port {port!r}")


def _pod_requests(pod: Pod) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in pod.spec.containers:
        requests = (container.resources.requests if container.resources else None) or {}
        for key, qty in requests.items():
            total[key] = total.get(key, Decimal(0)) + parse_quantity(qty)
    return total
