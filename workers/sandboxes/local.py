"""Local sandbox backend: one bubblewrap sandbox per SandboxSpec, driven through the in-sandbox agent.

On disk, under `root` (0711, owned by the user running Trove):
    <name>/meta.json     labels, secret, cgroup directories, supervisor pid and start time (0600)
    <name>/workspace/    bound read-write at /workspace (owned by the sandbox's host uid)
    <name>/agent.sock    the agent's listening socket (0600): bound here by the host and handed to the agent
                         (see bwrap.py), so the sandbox cannot see, replace or redirect it
    <name>/bwrap.log     stderr of the supervisor, bubblewrap and the agent
    <name>/status.json   bubblewrap's --json-status-fd output (child pid, namespace ids, exit code)
    .shared/             agent.py and the generated /etc files, bound read-only into every sandbox
Nothing under <name>/ is visible inside the sandbox except workspace/.

Process design. A sandbox is created by one process (a Celery worker, the reconciler) and used and destroyed
by others, and workers die and restart; so a sandbox must not depend on its creator staying alive. The
creator starts a small supervisor, `sh` in its own session (`setsid`), which joins the sandbox's cgroups
before forking and then runs bubblewrap and waits for it. bwrap's --die-with-parent ties the sandbox to
that supervisor, not to the creator: killing the supervisor takes the sandbox down; the creator dying (or
the thread that called create() exiting) does not. Nothing reaps a sandbox on its own: it lives until
destroy(), and the reconciler finds every sandbox by label through list() (which reports one whose
processes died as "failed").
The supervisor is the creator's child, and the creator reaps it (every call sweeps finished supervisors);
if the creator died first, it is reparented to pid 1, which must reap orphans (systemd, tini,
`docker run --init` / compose `init: true` all do).

Killing: destroy() SIGKILLs the pid namespace's init (bwrap's child, found via status.json and checked by
its namespace id; the kernel then kills every process in the namespace), the supervisor and bwrap (checked
by start time against pid reuse), and every process left in the sandbox's cgroups; then removes the
cgroups and the directory, and verifies that none of it is left. bwrap's mounts live in the sandbox's own
mount namespace and vanish with its last process; the host mount table never sees them.

Privileges: when Trove runs as root, commands run as the unprivileged host uid `host_uid`, mapped to uid 1000
inside, and the agent as another one, `agent_uid` (mapped to 0 inside, holding only CAP_SETUID, CAP_SETGID and
CAP_KILL, to start commands as 1000 and kill them at a timeout): bubblewrap runs as `agent_uid` (via setpriv)
and the creator writes the two-user map (see bwrap.py), so no command can signal, trace or read the agent.
Neither is host root: uid 1000 mapped to host root would make a sandbox escape, or a writable bind, act as
root's file owner. When Trove runs as an ordinary user, bubblewrap runs as the current user (unprivileged
user namespaces), agent and commands share uid 1000, and the agent makes itself undumpable (agent.py). bwrap opens
bind sources as the uid it runs as, so `root` must be reachable by it: a root with a parent directory that
uid cannot pass (pytest's 0700 basetemp, a checkout under /root) is refused with an error that names the
directory and the fix. The backend never falls back to running bubblewrap as root.

Network: "none" (and "proxy-only" without a proxy socket) keeps an empty network namespace (loopback only).
"proxy-only" with `spec.proxy_socket` binds that Unix socket's directory in (read-only; it must hold nothing
but sockets, so nothing else is exposed; a directory rather than the file so that a restarted proxy's new
socket is seen by running sandboxes) and the agent forwards 127.0.0.1:18080 inside to it (TROVE_PROXY_URL in
the sandbox's environment). The socket must be connectable by the agent's uid (mode 0666). "allow-list" cannot be
enforced locally: it is refused unless the backend was built with `allow_host_network=True`, in which case
the sandbox shares the host network without filtering.

Limits: memory, pids and CPU through one cgroup per sandbox per hierarchy, named `<name>.<root tag>` (see
cgroups.py; `limits_enforced` says whether the host allows them). `disk_mb` sizes the workspace, a tmpfs
(quota.py), and the /tmp tmpfs. Syscalls: every sandbox runs under a seccomp filter (seccomp.py); without
libseccomp no sandbox starts.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import select
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from workers.sandboxes import bwrap, procs, quota, seccomp
from workers.sandboxes.agent_client import AgentClient
from workers.sandboxes.base import (
    AgentIntegrityError,
    AgentUnavailable,
    ExecResult,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    SandboxStartFailed,
)
from workers.sandboxes.cgroups import CgroupError, CgroupManager, Limits, kill_and_remove

logger = logging.getLogger(__name__)

DEFAULT_ROOT = "var/sandboxes"
# An otherwise unused host uid for sandbox processes (in Debian's "allocated on demand" range).
DEFAULT_HOST_UID = 64999
# Another one for the in-sandbox agent, so that commands (DEFAULT_HOST_UID) cannot touch it.
DEFAULT_AGENT_UID = 64998
USERNS_SETUP_TIMEOUT = 30.0  # bubblewrap reports its child's pid within milliseconds of starting
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
AGENT_SOURCE = Path(__file__).with_name("agent.py")
# Trove's example harnesses, copied to .shared/harness and bound read-only at /opt/trove/harness.
HARNESS_EXAMPLES = Path(__file__).resolve().parents[1] / "harness" / "examples"
LOG_TAIL = 4000
KILL_TIMEOUT = 10.0
SUPERVISOR_EXIT_GRACE = 5.0  # after the namespace init is killed, bwrap and the supervisor exit in ms

# Supervisors started by this process, by sandbox directory, so that they can be reaped (see module doc).
_supervisors: dict[str, subprocess.Popen] = {}
_supervisors_lock = threading.Lock()


class LocalBackend(SandboxBackend):
    """Bubblewrap sandboxes under `root`. Thread-safe; several processes may share one `root`."""

    name = "local"

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        *,
        host_uid: int | None = DEFAULT_HOST_UID,
        agent_uid: int = DEFAULT_AGENT_UID,
        cgroup_parent: str = "trove",
        use_cgroups: bool = True,
        default_pids: int | None = 1024,
        default_memory_mb: int | None = None,
        default_cpu: float | None = None,
        allow_host_network: bool = False,
        bwrap_path: str = "/usr/bin/bwrap",
        python: str = "/usr/bin/python3",
        setpriv: str = "/usr/bin/setpriv",
        harness_dir: str | os.PathLike[str] | None = HARNESS_EXAMPLES,
        bundle_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        if os.geteuid() == 0 and host_uid is None:
            raise SandboxError("host_uid=None while Trove runs as root would run sandboxes as host root (uid "
                               "1000 inside mapped to it): give an unprivileged host_uid", reason="bad_host_uid",
                               permanent=True)
        self.host_uid: int | None = host_uid if os.geteuid() == 0 else None
        if self.host_uid is not None and agent_uid in (0, self.host_uid):
            raise SandboxError(f"agent_uid {agent_uid} must be an unprivileged uid other than host_uid "
                               f"{self.host_uid}: commands could signal and trace an agent of their own uid",
                               reason="bad_agent_uid", permanent=True)
        self.agent_uid = agent_uid
        self.defaults = Limits(cpu=default_cpu, memory_mb=default_memory_mb, pids=default_pids)
        self.allow_host_network = allow_host_network
        self.bwrap_path = bwrap_path
        self.python = python
        self.setpriv = setpriv
        self.harness_dir = harness_dir
        # Harness bundles (read-only at /opt/trove/bundles); made here so a bundle installed later is seen.
        self.bundle_dir = os.path.abspath(bundle_dir) if bundle_dir else ""
        self.cgroups = CgroupManager(cgroup_parent, enabled=use_cgroups)
        self.limits_enforced = self.cgroups.enforced
        self.root_tag = hashlib.sha256(self.root.encode()).hexdigest()[:8]
        self.shared_dir = os.path.join(self.root, ".shared")
        self.seccomp_program = _seccomp_program()
        self._prepare_root()
        self.host_workspace_mounts = quota.host_mounts_work(self.shared_dir)

    # ------------------------------------------------------------ interface

    def create(self, spec: SandboxSpec, *, wait: bool = True, timeout: float = 60.0) -> SandboxHandle:
        """Idempotent by name: if `spec.name` exists, returns it (waiting for it with `wait`). With `wait`,
        returns once the agent answers a ping, else destroys everything and raises SandboxStartFailed."""
        check_name(spec.name)
        _sweep_supervisors()
        paths = self._paths(spec.name)
        try:
            os.mkdir(paths.dir, 0o711)  # the atomic claim of the name among racing creators
        except FileExistsError:
            return self._existing(spec.name, wait=wait, timeout=timeout)
        try:
            meta = self._launch(spec, paths)
        except SandboxStartFailed:
            self.destroy(spec.name)
            raise
        except Exception as exc:
            self.destroy(spec.name)
            raise SandboxStartFailed(f"sandbox {spec.name} could not start: {exc}", reason="launch") from exc
        supervisor = _our_supervisor(paths, meta)
        if not wait:
            _close_ready_pipe(supervisor)
            return self._handle(spec.name, meta, state="provisioning")
        return self._await_ready(spec.name, meta, timeout=timeout, ready_pipe=supervisor)

    def get(self, name: str) -> SandboxHandle:
        check_name(name)
        paths = self._paths(name)
        meta = _read_json(paths.meta)
        if meta is None:
            if os.path.isdir(paths.dir):  # claimed by a create that has not written meta.json yet
                return SandboxHandle(name=name, state="provisioning")
            raise SandboxNotFound(f"no local sandbox {name}", reason="not_found")
        return self._handle(name, meta, state=self._state(meta, paths))

    def list(self, labels: dict[str, str]) -> list[SandboxHandle]:
        handles = []
        for entry in sorted(os.listdir(self.root)):
            if entry.startswith(".") or not NAME_RE.match(entry):
                continue
            try:
                handle = self.get(entry)
            except SandboxNotFound:
                continue  # destroyed while we listed
            if all(handle.labels.get(k) == v for k, v in labels.items()):
                handles.append(handle)
        return handles

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
        return _client(handle).exec(cmd, timeout=timeout, idle_timeout=idle_timeout, max_output=max_output,
                                    cwd=cwd, env=env, before_send=before_send)

    def read_file(self, handle: SandboxHandle, path: str) -> bytes:
        return _client(handle).read_file(path)

    def write_file(self, handle: SandboxHandle, path: str, content: bytes, *,
                   before_send: Callable[[], None] | None = None) -> None:
        _client(handle).write_file(path, content, before_send=before_send)

    def write_files(self, handle: SandboxHandle, files: dict[str, bytes], *,
                    before_send: Callable[[], None] | None = None) -> None:
        _client(handle).write_files(files, before_send=before_send)

    def destroy(self, name: str) -> None:
        """Idempotent. Raises SandboxError (transient) if anything is left behind, so a retry can finish."""
        check_name(name)
        paths = self._paths(name)
        meta = _read_json(paths.meta) or {}
        if meta:
            _write_json(paths.meta, {**meta, "terminating": True})
        _kill_sandbox(meta, paths)
        cgroup_dirs = sorted(set(meta.get("cgroups", [])) | set(self.cgroup_dirs(name)))
        left = kill_and_remove(cgroup_dirs, timeout=KILL_TIMEOUT)
        _unmount_workspace(paths)
        shutil.rmtree(paths.dir, ignore_errors=True)
        problems = _leftovers(paths, meta, left)
        _sweep_supervisors()
        if problems:
            raise SandboxError(f"destroy of {name} left: {'; '.join(problems)}", reason="destroy_incomplete")

    def cgroup_dirs(self, name: str) -> builtins.list[str]:  # `list` here is the method above
        """The cgroup directories sandbox `name` has (or would have) on this host."""
        return self.cgroups.dirs_for(self._cgroup_name(name))

    def _cgroup_name(self, name: str) -> str:
        """The sandbox's name, tagged with this root: two roots on one host (a test run beside a dev
        server) may both hold a `trove-1-1`, and one must never kill the other's processes."""
        return f"{name}.{self.root_tag}"

    # ------------------------------------------------------------ create

    def _launch(self, spec: SandboxSpec, paths: bwrap.SandboxPaths) -> dict[str, Any]:
        """Lay out the directory, make the cgroups, start the supervisor. Returns the meta written."""
        launch = self._launch_config(spec, paths)
        os.mkdir(paths.workspace, 0o755)
        if self.host_uid is not None:
            os.chown(paths.workspace, self.host_uid, self.host_uid)
        self._mount_workspace(spec, paths)
        meta: dict[str, Any] = {"name": spec.name, "labels": dict(spec.labels), "secret": secrets.token_urlsafe(32),
                                "created_at": time.time(), "network": spec.network}
        try:
            meta["cgroups"] = self.cgroups.create(self._cgroup_name(spec.name), self._limits(spec))
        except CgroupError as exc:
            raise SandboxStartFailed(str(exc), reason="cgroup") from exc
        _write_json(paths.meta, meta)  # labels and cgroups on disk before any process exists
        supervisor = self._start_supervisor(launch, meta)
        meta.update(pid=supervisor.pid, pid_start=procs.start_time(supervisor.pid))
        _write_json(paths.meta, meta)
        return meta

    def _launch_config(self, spec: SandboxSpec, paths: bwrap.SandboxPaths) -> bwrap.Launch:
        if spec.rootfs and not os.path.isdir(spec.rootfs):
            raise SandboxStartFailed(f"rootfs {spec.rootfs!r} is not a directory", reason="bad_rootfs",
                                     permanent=True)
        return bwrap.Launch(
            name=spec.name, paths=paths, shared_dir=self.shared_dir, python=self.python,
            rootfs=os.path.abspath(spec.rootfs) if spec.rootfs else "", share_net=self._share_net(spec),
            proxy_socket=self._proxy_socket(spec), tmp_size_mb=spec.disk_mb, harness=self.harness_dir is not None,
            bundles=self._bundles(),
            env=tuple(sorted(spec.env.items())),
            workspace_tmpfs_mb=None if self.host_workspace_mounts else quota.workspace_size_mb(spec.disk_mb),
        )

    def _bundles(self) -> str:
        """The bundle directory, made on first use: bound as a directory so later installs show up inside."""
        if self.bundle_dir:
            os.makedirs(self.bundle_dir, mode=0o755, exist_ok=True)
        return self.bundle_dir

    def _mount_workspace(self, spec: SandboxSpec, paths: bwrap.SandboxPaths) -> None:
        """The workspace's size limit, where the host can mount: a tmpfs of disk_mb on its directory."""
        if not self.host_workspace_mounts:
            return  # bubblewrap mounts it inside instead (Launch.workspace_tmpfs_mb)
        try:
            quota.mount_workspace(paths.workspace, quota.workspace_size_mb(spec.disk_mb))
        except quota.QuotaError as exc:
            raise SandboxStartFailed(str(exc), reason="workspace_quota") from exc

    def _share_net(self, spec: SandboxSpec) -> bool:
        if spec.network in ("none", "proxy-only"):
            return False
        if spec.network == "allow-list" and self.allow_host_network:
            return True
        raise SandboxStartFailed(
            f"network policy {spec.network!r} cannot be enforced by the local backend (it has no egress "
            "filter); use 'none' or 'proxy-only', or build LocalBackend(allow_host_network=True)",
            reason="network_policy_unsupported", permanent=True)

    def _proxy_socket(self, spec: SandboxSpec) -> str:
        if spec.network != "proxy-only" or not spec.proxy_socket:
            return ""  # proxy-only without a proxy to reach is simply no network
        path = os.path.abspath(spec.proxy_socket)
        if not _is_socket(path):
            raise SandboxStartFailed(f"proxy socket {path!r} does not exist (is the proxy running?)", reason="no_proxy")
        directory = os.path.dirname(path)
        others = [e for e in os.listdir(directory) if not _is_socket(os.path.join(directory, e))]
        if others:  # the whole directory is bound in: it must not expose anything but the proxy
            raise SandboxStartFailed(
                f"proxy socket directory {directory!r} holds other files too ({others[0]!r}, ...): give the proxy "
                "socket a directory of its own", reason="proxy_socket_dir", permanent=True)
        blocked = _untraversable_ancestor(directory, self.agent_uid) if self.host_uid is not None else None
        if blocked:
            raise SandboxStartFailed(f"proxy socket {path!r}: {blocked} is not searchable by the agent's uid "
                                     f"{self.agent_uid}", reason="proxy_socket_access", permanent=True)
        return path

    def _limits(self, spec: SandboxSpec) -> Limits:
        return Limits(cpu=spec.cpu if spec.cpu is not None else self.defaults.cpu,
                      memory_mb=spec.memory_mb if spec.memory_mb is not None else self.defaults.memory_mb,
                      pids=spec.pids if spec.pids is not None else self.defaults.pids)

    def _start_supervisor(self, launch: bwrap.Launch, meta: dict[str, Any]) -> subprocess.Popen:
        """Start the supervisor with the agent's socket and secret on its stdin (a Unix socket) and, with two
        users, write the user namespace's map before bwrap goes on. Raises SandboxStartFailed."""
        bwrap_uid = self.agent_uid if self._two_users() else None
        setpriv = [] if bwrap_uid is None else [
            self.setpriv, f"--reuid={bwrap_uid}", f"--regid={bwrap_uid}", "--clear-groups", "--"]
        listener = _bind_agent_socket(launch.paths)
        host_end, agent_end = socket.socketpair()
        uid_map = _UidMapChannel() if self._two_users() else None
        seccomp_fd = seccomp.program_fd(self.seccomp_program)
        launch = dataclasses.replace(launch, seccomp_fd=seccomp_fd, uid_map_fds=uid_map.child_fds if uid_map else None)
        try:
            argv = bwrap.supervisor_argv(launch, cgroup_dirs=meta["cgroups"], bwrap=self.bwrap_path,
                                         setpriv=setpriv)
            with open(launch.paths.log, "wb") as log:
                supervisor = subprocess.Popen(argv, stdin=agent_end.fileno(), stdout=subprocess.PIPE, stderr=log,
                                              start_new_session=True, env={"PATH": "/usr/bin:/bin"},
                                              pass_fds=(seccomp_fd, *(launch.uid_map_fds or ())))
        except BaseException:
            listener.close()
            host_end.close()
            if uid_map is not None:
                uid_map.close_parent_ends()
            raise
        finally:
            os.close(seccomp_fd)  # the supervisor holds its own copy
            agent_end.close()
            if uid_map is not None:
                uid_map.close_child_ends()
        with _supervisors_lock:
            _supervisors[launch.paths.dir] = supervisor
        _hand_over(host_end, listener, meta["secret"])
        if uid_map is not None:
            uid_map.complete(self.agent_uid, self.host_uid)  # type: ignore[arg-type]  # _two_users()
        return supervisor

    def _two_users(self) -> bool:
        """The agent and the commands get host uids of their own (possible only as root)."""
        return self.host_uid is not None

    def _await_ready(self, name: str, meta: dict[str, Any], *, timeout: float,
                     ready_pipe: subprocess.Popen | None = None) -> SandboxHandle:
        """Wait for the agent, then ping it. Our own supervisor's stdout carries the agent's ready line (and
        closes if the sandbox dies), so no polling is needed; otherwise poll until the agent listens on its
        socket (a connect is refused before)."""
        paths = self._paths(name)
        deadline = time.monotonic() + timeout
        if ready_pipe is not None:
            alive = _read_ready_line(ready_pipe, deadline)
        else:
            alive = _poll_for_socket(paths, meta, deadline)
        if not alive:
            self._fail(name, paths, "sandbox exited during startup", reason="exited")
        try:
            _client(self._handle(name, meta, state="provisioning")).ping(
                timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except AgentUnavailable as exc:
            reason = "timeout" if time.monotonic() >= deadline else "no_answer"
            self._fail(name, paths, f"agent did not answer within {timeout:.1f} s ({exc})", reason=reason)
        return self._handle(name, meta, state="ready")

    def _fail(self, name: str, paths: bwrap.SandboxPaths, message: str, *, reason: str) -> NoReturn:
        log = _tail(paths.log)
        self.destroy(name)
        raise SandboxStartFailed(f"sandbox {name}: {message}" + (f"; log: {log}" if log else ""), reason=reason)

    def _existing(self, name: str, *, wait: bool, timeout: float) -> SandboxHandle:
        """A create of a name that exists: wait for its meta (a racing creator is writing it), then treat it
        like our own. A dead one, with `wait`, is destroyed and reported as SandboxStartFailed."""
        paths = self._paths(name)
        deadline = time.monotonic() + timeout
        meta = _read_json(paths.meta)
        while meta is None or "pid" not in meta:
            if not os.path.isdir(paths.dir) or time.monotonic() > deadline:
                raise SandboxStartFailed(f"sandbox {name} is being created or destroyed elsewhere",
                                         reason="busy")
            time.sleep(0.005)
            meta = _read_json(paths.meta)
        if not wait:
            return self._handle(name, meta, state=self._state(meta, paths))
        return self._await_ready(name, meta, timeout=max(0.1, deadline - time.monotonic()))

    # ------------------------------------------------------------ state

    def _state(self, meta: dict[str, Any], paths: bwrap.SandboxPaths) -> str:
        if meta.get("terminating"):
            return "terminating"
        if "pid" not in meta:
            return "provisioning"
        if not _supervisor_alive(meta, paths):
            return "failed"
        return "ready" if _agent_listening(paths.socket) else "provisioning"

    def _handle(self, name: str, meta: dict[str, Any], *, state: str) -> SandboxHandle:
        paths = self._paths(name)
        reason = _failure_reason(paths) if state == "failed" else ""
        return SandboxHandle(
            name=name, state=state, endpoint=f"unix:{paths.socket}", secret=meta.get("secret", ""),
            labels=dict(meta.get("labels", {})), reason=reason,
            details={"dir": paths.dir, "pid": meta.get("pid"), "cgroups": meta.get("cgroups", []),
                     "limits_enforced": self.limits_enforced, "network": meta.get("network")},
        )

    def _paths(self, name: str) -> bwrap.SandboxPaths:
        return bwrap.SandboxPaths(os.path.join(self.root, name))

    def _prepare_root(self) -> None:
        """Create `root` and the shared files (agent, compiled agent, /etc files). Raises SandboxError if the
        uid bubblewrap runs as cannot reach `root` (see _check_root_reachable)."""
        _make_passable_dirs(self.root)
        os.makedirs(os.path.join(self.shared_dir, "etc"), exist_ok=True)
        os.chmod(self.root, 0o711)
        for directory in (self.shared_dir, os.path.join(self.shared_dir, "etc")):
            os.chmod(directory, 0o755)
        agent_py = os.path.join(self.shared_dir, "agent.py")
        if _install(agent_py, AGENT_SOURCE.read_bytes()) or not os.path.exists(agent_py + "c"):
            _compile_agent(self.python, agent_py)
        for filename, text in bwrap.GENERATED_ETC.items():
            _install(os.path.join(self.shared_dir, "etc", filename), text.encode())
        if self.harness_dir is not None:
            self._install_harnesses(Path(self.harness_dir))
        self._check_root_reachable()

    def _check_root_reachable(self) -> None:
        """bwrap opens the sandbox's bind sources as the unprivileged uid it runs as: a root that uid cannot
        reach is refused. Never fall back to running bwrap as root (uid 1000 inside would be host root)."""
        if self.host_uid is None:
            return  # not root: bwrap runs as the current user, who made the root
        blocked = _untraversable_ancestor(self.root, self.agent_uid)
        if blocked:
            raise SandboxError(unreachable_root_message(self.root, blocked, self.agent_uid),
                               reason="sandbox_root_unreachable", permanent=True)

    def _install_harnesses(self, source: Path) -> None:
        target = os.path.join(self.shared_dir, "harness")
        os.makedirs(target, exist_ok=True)
        os.chmod(target, 0o755)
        for path in sorted(source.iterdir()) if source.is_dir() else []:
            if path.is_file() and not path.name.startswith("."):
                _install(os.path.join(target, path.name), path.read_bytes())


# ---------------------------------------------------------------- module helpers


def check_name(name: str) -> None:
    """Names become directory and cgroup names: letters, digits, `_.-`, at most 63, no leading dot."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SandboxError(f"bad sandbox name {name!r}", reason="bad_name", permanent=True)


class LocalAgentClient(AgentClient):
    """AgentClient for the agent's host-side socket. It connects only to a socket file that is no symlink and
    is owned by us, in a directory owned by us that nobody else can write (else AgentIntegrityError), and it
    connects through an O_PATH descriptor of that very file (/proc/self/fd/N): nothing can be swapped in
    between the check and the connect, and a socket path longer than sun_path allows still works."""

    def _connect(self) -> socket.socket:
        if not self.endpoint.startswith("unix:"):
            return super()._connect()
        fd = _open_agent_socket(self.endpoint.removeprefix("unix:"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(fd)
        return sock


def _open_agent_socket(path: str) -> int:
    """An O_PATH descriptor of the agent socket at `path`, checked (see LocalAgentClient). A missing socket is
    AgentUnavailable (the sandbox is gone); one that fails a check is AgentIntegrityError."""
    directory = os.path.dirname(path)
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise AgentUnavailable(f"no agent socket at {path}", reason="agent_unavailable") from exc
    try:
        found, parent = os.fstat(fd), os.lstat(directory)
        problem = _socket_problem(found, parent)
    except BaseException:
        os.close(fd)
        raise
    if problem:
        os.close(fd)
        raise AgentIntegrityError(f"refusing the agent socket {path}: {problem}", reason="agent_socket")
    return fd


def _socket_problem(found: os.stat_result, parent: os.stat_result) -> str:
    me = os.geteuid()
    if stat.S_ISLNK(found.st_mode):
        return "it is a symlink"
    if not stat.S_ISSOCK(found.st_mode):
        return "it is not a socket"
    if found.st_uid != me:
        return f"it is owned by uid {found.st_uid}, not {me}"
    if not stat.S_ISDIR(parent.st_mode) or parent.st_uid != me or parent.st_mode & 0o022:
        return f"its directory is not a directory owned by uid {me} that only it can write"
    return ""


def _bind_agent_socket(paths: bwrap.SandboxPaths) -> socket.socket:
    """The agent's socket, bound (not listening: a connection is refused until the agent listens) at
    paths.socket, mode 0600. Bound through a descriptor of the directory, for paths beyond sun_path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        dir_fd = os.open(paths.dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            sock.bind(f"/proc/self/fd/{dir_fd}/{bwrap.SOCKET_NAME}")
            os.chmod(bwrap.SOCKET_NAME, 0o600, dir_fd=dir_fd)  # just made by us in our own directory
        finally:
            os.close(dir_fd)
    except BaseException:
        sock.close()
        raise
    return sock


def _hand_over(host_end: socket.socket, listener: socket.socket, secret: str) -> None:
    """Send the agent its secret and its listening socket (SCM_RIGHTS), then let go of both: the agent holds
    the only copy of the socket, so a dead agent means refused connections, not a silent backlog."""
    try:
        socket.send_fds(host_end, [secret.encode() + b"\n"], [listener.fileno()])
        host_end.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # it died already; the readiness wait reports why
    finally:
        host_end.close()
        listener.close()


def _agent_listening(path: str) -> bool:
    """The agent has taken over its socket and listens on it (a connect is not refused). Connects without
    sending anything: the agent drops such a connection at once."""
    try:
        fd = _open_agent_socket(path)
    except SandboxError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.setblocking(False)
        probe.connect(f"/proc/self/fd/{fd}")
        return True
    except BlockingIOError:
        return True  # listening, with a full backlog
    except OSError:
        return False
    finally:
        probe.close()
        os.close(fd)


class _UidMapChannel:
    """The two pipes of the two-user start (see bwrap.Launch.uid_map_fds): bwrap reports its child's pid on
    the first and waits on the second until the creator has written the user namespace's map."""

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()

    @property
    def child_fds(self) -> tuple[int, int]:
        return self.info_w, self.block_r

    def close_child_ends(self) -> None:
        os.close(self.info_w)
        os.close(self.block_r)

    def close_parent_ends(self) -> None:
        os.close(self.info_r)
        os.close(self.block_w)

    def complete(self, agent_uid: int, command_uid: int) -> None:
        """Map uid/gid 0 to `agent_uid` and 1000 to `command_uid` in bwrap's new user namespace and let bwrap
        go on. Raises SandboxStartFailed if bwrap died first or the map cannot be written (bwrap then stays
        blocked, or fails on an unmapped uid: the agent never runs with the wrong users)."""
        try:
            pid = _read_child_pid(self.info_r, time.monotonic() + USERNS_SETUP_TIMEOUT)
            if pid is None:
                raise SandboxStartFailed("bubblewrap exited before it made the user namespace", reason="exited")
            mapping = bwrap.uid_map(agent_uid, command_uid)
            try:
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{pid}/{name}", "w") as f:
                        f.write(mapping)
            except OSError as exc:
                raise SandboxStartFailed(f"cannot map the sandbox's users (pid {pid}): {exc}",
                                         reason="uid_map") from exc
            os.write(self.block_w, b"1")
        finally:
            self.close_parent_ends()


def _read_child_pid(fd: int, deadline: float) -> int | None:
    """bwrap's child pid from its --info-fd JSON; None if bwrap exited (end of stream) or the deadline passed."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    received = b""
    while True:
        remaining_ms = (deadline - time.monotonic()) * 1000
        if remaining_ms <= 0 or not poller.poll(remaining_ms):
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        received += chunk
        try:
            return int(json.loads(received)["child-pid"])
        except (ValueError, KeyError):
            continue  # not all of it yet


def _client(handle: SandboxHandle) -> AgentClient:
    if not handle.endpoint:
        raise AgentUnavailable(f"sandbox {handle.name} has no agent endpoint yet", reason="not_ready")
    return LocalAgentClient(handle.endpoint, handle.secret)


def _our_supervisor(paths: bwrap.SandboxPaths, meta: dict[str, Any]) -> subprocess.Popen | None:
    with _supervisors_lock:
        ours = _supervisors.get(paths.dir)
    return ours if ours is not None and ours.pid == meta.get("pid") else None


def _read_ready_line(supervisor: subprocess.Popen | None, deadline: float) -> bool:
    """Block until the agent's ready line arrives on the supervisor's stdout (True), the pipe closes
    because the sandbox died (False), or the deadline passes (True: let the ping decide). Closes our end."""
    assert supervisor is not None and supervisor.stdout is not None
    fd = supervisor.stdout.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    received = b""
    try:
        while b"\n" not in received:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0 or not poller.poll(remaining_ms):
                return True
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            received += chunk
        return True
    finally:
        _close_ready_pipe(supervisor)


def _close_ready_pipe(supervisor: subprocess.Popen | None) -> None:
    if supervisor is not None and supervisor.stdout is not None:
        supervisor.stdout.close()


def _poll_for_socket(paths: bwrap.SandboxPaths, meta: dict[str, Any], deadline: float) -> bool:
    """For a sandbox started elsewhere: poll (short backoff) until its agent listens (True), its
    supervisor is gone (False) or the deadline passes (True: let the ping decide)."""
    delay = 0.0005
    while not _agent_listening(paths.socket):
        if not _supervisor_alive(meta, paths):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)
    return True


def _supervisor_alive(meta: dict[str, Any], paths: bwrap.SandboxPaths) -> bool:
    with _supervisors_lock:
        ours = _supervisors.get(paths.dir)
    if ours is not None and ours.pid == meta.get("pid"):
        return ours.poll() is None
    return procs.is_alive(meta.get("pid"), meta.get("pid_start"))


def _kill_sandbox(meta: dict[str, Any], paths: bwrap.SandboxPaths) -> None:
    """Stop every process of the sandbox so that each one is reaped by its own parent (an orphan would be
    left to pid 1). SIGKILL the pid namespace's init: the kernel kills the rest of the namespace, bwrap
    reaps the init and exits, the supervisor reaps bwrap and exits, and we (or the creator) reap the
    supervisor. If there is no namespace yet (startup failed or is still under way), kill bwrap instead.
    Every pid is checked (namespace id, start time) before it is killed, against pid reuse."""
    init_pid, init_ns = _namespace_init(paths)
    if _init_running(init_pid, init_ns):
        procs.kill(init_pid)  # type: ignore[arg-type]
    elif procs.is_alive(meta.get("pid"), meta.get("pid_start")):
        for child in procs.children(meta["pid"]):
            procs.kill(child)
    if not _await_supervisor_exit(paths, meta, timeout=SUPERVISOR_EXIT_GRACE):
        if procs.is_alive(meta.get("pid"), meta.get("pid_start")):
            for child in procs.children(meta["pid"]):
                procs.kill(child)
            procs.kill(meta["pid"])
        _await_supervisor_exit(paths, meta, timeout=KILL_TIMEOUT)


def _init_running(pid: int | None, namespace: str | None) -> bool:
    """The namespace init is still running (a zombie counts as gone: it has exited)."""
    return bool(pid) and procs.pid_namespace(pid) == namespace and procs.start_time(pid) is not None  # type: ignore[arg-type]


def _namespace_init(paths: bwrap.SandboxPaths) -> tuple[int | None, str | None]:
    """(host pid, 'pid:[inode]') of the sandbox's pid namespace init, from bwrap's status file."""
    try:
        with open(paths.status) as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return None, None
    if "child-pid" not in first or "pid-namespace" not in first:
        return None, None
    return int(first["child-pid"]), f"pid:[{first['pid-namespace']}]"


def _await_supervisor_exit(paths: bwrap.SandboxPaths, meta: dict[str, Any], *, timeout: float) -> bool:
    """Wait until the supervisor has exited: reap it if it is our child, else watch it (a zombie counts
    as exited; its parent reaps it). True if it is gone."""
    with _supervisors_lock:
        ours = _supervisors.get(paths.dir)
    if ours is not None and ours.pid == meta.get("pid"):
        try:
            ours.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        with _supervisors_lock:
            _supervisors.pop(paths.dir, None)
        return True
    return procs.wait_gone(lambda: not procs.is_alive(meta.get("pid"), meta.get("pid_start")), timeout=timeout)


def _leftovers(paths: bwrap.SandboxPaths, meta: dict[str, Any], cgroups_left: list[str]) -> list[str]:
    """What destroy() failed to remove. Every sandbox process (supervisor included) is in the sandbox's
    cgroups, so their removal proves no process is left; without cgroups, scan /proc for any process
    whose command line names the sandbox directory."""
    problems = [f"cgroup {d}" for d in cgroups_left]
    if os.path.exists(paths.dir):
        problems.append(f"directory {paths.dir}")
    if not meta.get("cgroups"):
        problems += [f"process {pid}" for pid in procs.processes_mentioning(paths.dir + "/")]
    with open("/proc/self/mounts") as f:
        if any(paths.dir in line for line in f):
            problems.append(f"a mount under {paths.dir}")
    if procs.is_alive(meta.get("pid"), meta.get("pid_start")):
        problems.append(f"supervisor pid {meta['pid']}")
    init_pid, init_ns = _namespace_init(paths)
    if _init_running(init_pid, init_ns):
        problems.append(f"namespace init pid {init_pid}")
    return problems


def _sweep_supervisors() -> None:
    """Reap supervisors of sandboxes that were destroyed by another process (or died)."""
    with _supervisors_lock:
        for key, supervisor in list(_supervisors.items()):
            if supervisor.poll() is not None:
                del _supervisors[key]


def _failure_reason(paths: bwrap.SandboxPaths) -> str:
    exit_code = None
    try:
        with open(paths.status) as f:
            for line in f:
                exit_code = json.loads(line).get("exit-code", exit_code)
    except (OSError, ValueError):
        pass
    log = _tail(paths.log, 500)
    return f"processes exited (exit code {exit_code})" + (f": {log}" if log else "")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _tail(path: str, size: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic replace, readable by the owner only (meta.json holds the secret)."""
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as f:
        f.write(json.dumps(data))  # dumps uses the C encoder; dump(f) streams through the Python one
    os.replace(temporary, path)


def _install(path: str, content: bytes) -> bool:
    """Write a shared file (0644) if its content differs, atomically (running sandboxes keep their copy).
    True if it was written."""
    try:
        with open(path, "rb") as f:
            if f.read() == content:
                return False
    except OSError:
        pass
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as f:
        f.write(content)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    return True


def _compile_agent(python: str, source: str) -> None:
    """agent.py -> agent.pyc with the sandbox's own interpreter (bytecode is version-specific)."""
    script = ("import os, py_compile, sys; tmp = sys.argv[2] + f'.{os.getpid()}.tmp'; "
              "py_compile.compile(sys.argv[1], cfile=tmp, doraise=True); os.chmod(tmp, 0o644); "
              "os.replace(tmp, sys.argv[2])")
    done = subprocess.run([python, "-I", "-S", "-c", script, source, source + "c"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"cannot compile the agent with {python}: {done.stderr.strip()}",
                           reason="agent_compile", permanent=True)


def _unmount_workspace(paths: bwrap.SandboxPaths) -> None:
    """Every destroy unmounts (a creator may have died between mount and meta); a failure is reported by
    _leftovers as the mount left."""
    try:
        quota.unmount_workspace(paths.workspace)
    except quota.QuotaError as exc:
        logger.warning("%s", exc)


def _seccomp_program() -> bytes:
    """The sandboxes' seccomp filter; without one no sandbox may start (fail closed)."""
    try:
        return seccomp.sandbox_filter()
    except seccomp.SeccompUnavailable as exc:
        raise SandboxError(str(exc), reason="seccomp_unavailable", permanent=True) from exc


def unreachable_root_message(root: str, blocked: str, uid: int) -> str:
    st = os.stat(blocked)
    return (f"sandbox root {root} cannot be used: {blocked} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
            f"{st.st_uid}) does not let uid {uid} pass, and bubblewrap runs as that unprivileged uid (it opens "
            "the sandbox's files as it). Trove will not run sandboxes as root instead. Fix: `chmod o+x "
            f"{blocked}` (others may pass through it, not list it), or set TROVE_SANDBOX_ROOT to a directory "
            "whose parents every user may pass, such as one under /var/lib/trove-sandboxes (the default when "
            "Trove runs as root).")


def _make_passable_dirs(root: str) -> None:
    """Create the missing directories down to `root` as 0711 (mkdir's mode is cut by the umask; a umask of
    077 would leave them closed to the sandbox uids). Existing ones are left as they are."""
    missing = []
    path = root
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            continue  # another process made it meanwhile
        os.chmod(directory, 0o711)


def _untraversable_ancestor(path: str, uid: int) -> str | None:
    """bwrap opens bind sources as the sandbox's host uid, so every directory from / down to `path` must let
    that uid pass. Returns the first that does not, or None."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        current = "/".join(parts[:depth]) or "/"
        st = os.stat(current)
        if not (st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100)):
            return current
    return None
