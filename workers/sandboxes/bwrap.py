"""The bubblewrap command line and supervisor for one local sandbox: builds argv lists, starts nothing.

What a sandbox sees:
    /usr /bin /lib /lib64 /sbin   the host's (or `rootfs`'s), read-only
    /etc                          a minimal one: generated passwd/group/hosts/nsswitch.conf plus a few host
                                  files the dynamic linker and TLS need (all read-only); `rootfs`'s own /etc
    /proc /dev /tmp /dev/shm      fresh (a new pid namespace's procfs, a minimal /dev, private tmpfs: /tmp of
                                  disk_mb, /dev/shm of quota.SHM_MB)
    /workspace                    read-write, the working directory: a tmpfs of disk_mb (quota.py), mounted on
                                  the sandbox's host workspace directory (root) or by bwrap inside
    /opt/trove/agent              the agent (bytecode, or source under a rootfs), read-only
    /opt/trove/harness            Trove's example harnesses (workers/harness/examples), read-only
    /opt/trove/bundles            the installed harness bundles (TROVE_HARNESS_DIR, workers/harness/presets/
                                  bundles.py), read-only, when the backend has a bundle directory
    /run/proxy/                   network "proxy-only": the directory of the recording proxy's Unix socket
                                  (the directory, so a restarted proxy's new socket is seen), reached from
                                  inside at http://127.0.0.1:18080 through the agent's forwarder
and `/` itself is read-only. All namespaces are new (user, pid, mount, ipc, uts, cgroup, and network unless
the policy shares the host's), no capabilities, uid/gid 1000, a clean environment, its own session (no
terminal injection), no_new_privs.

The agent's socket is not in that view at all: the host binds it in the sandbox's host directory and hands
the bound socket to the agent over its stdin (a Unix socket, SCM_RIGHTS), so nothing inside can replace it.

Two users (`Launch.uid_map_fds`, when Trove runs as root): the user namespace maps uid/gid 0 to the agent's
host uid and 1000 to the commands' host uid. bubblewrap runs as the agent's host uid and blocks until the
creator has written that two-line map (only root may map more than its own uid), and the agent runs as 0
with just CAP_SETUID, CAP_SETGID (to start each command, and each file operation, as 1000 with no
capabilities) and CAP_KILL (to kill a command's process group at its timeout): commands cannot signal, ptrace or read /proc of the agent. bubblewrap's own
--disable-userns cannot be combined with an externally written map; the seccomp filter refuses new user
namespaces instead. Without root (one host uid only) the agent and commands share uid 1000, and nested user
namespaces are disabled by bubblewrap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from workers.sandboxes import quota

SANDBOX_UID = 1000
AGENT_UID = 0  # inside the sandbox, with two users: mapped to the agent's own host uid, never to host root
WORKSPACE = "/workspace"
SOCKET_NAME = "agent.sock"
AGENT_PATH = "/opt/trove/agent"  # python runs a file with a .pyc magic number as bytecode
HARNESS_DIR = "/opt/trove/harness"
BUNDLES_DIR = "/opt/trove/bundles"
PROXY_DIR = "/run/proxy"
PROXY_PORT = 18080
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Host /etc entries worth having: the loader cache (faster starts), the Debian alternatives symlinks that
# /usr/bin points into (awk, editor, ...), the time zone and CA certificates.
HOST_ETC = ("ld.so.cache", "alternatives", "localtime", "ssl", "ca-certificates")
GENERATED_ETC = {
    "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
              "sandbox:x:1000:1000:sandbox:/tmp:/bin/bash\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",  # not the workspace: tool caches there would show up in the workspace diff
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "SHELL": "/bin/bash",
    "LANG": "C.UTF-8",
}

# The supervisor: runs in its own session as a child of the creating process, joins the sandbox's cgroups
# before it forks anything (so every sandbox process is accounted from the start), then runs bubblewrap
# and waits for it. It deliberately does not `exec` bwrap: bwrap's --die-with-parent then refers to this
# shell, so killing the shell takes the sandbox down, while the creator's death does not.
# stdin (a Unix socket) carries the agent's secret and listening socket through to `--listen stdin`; stdout
# carries the agent's ready line back to the creator; stderr is the sandbox log.
#   $1 = sandbox dir, $2 = number of cgroup dirs, then the cgroup dirs, then the bwrap command line.
SUPERVISOR_SCRIPT = """\
dir=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do
  echo $$ > "$1/cgroup.procs" || { echo "trove: cannot join cgroup $1" >&2; exit 97; }
  n=$((n - 1)); shift
done
"$@" 3>"$dir/status.json"
exit $?
"""


@dataclass(frozen=True)
class SandboxPaths:
    """Host paths of one sandbox."""

    dir: str

    @cached_property
    def meta(self) -> str:
        return os.path.join(self.dir, "meta.json")

    @cached_property
    def workspace(self) -> str:
        return os.path.join(self.dir, "workspace")

    @cached_property
    def socket(self) -> str:
        """The agent's listening socket: bound by the host, in a directory the sandbox never sees."""
        return os.path.join(self.dir, SOCKET_NAME)

    @cached_property
    def log(self) -> str:
        return os.path.join(self.dir, "bwrap.log")

    @cached_property
    def status(self) -> str:
        return os.path.join(self.dir, "status.json")


@dataclass(frozen=True)
class Launch:
    """Everything one sandbox's command line depends on."""

    name: str
    paths: SandboxPaths
    shared_dir: str  # holds agent.py (and agent.pyc, compiled for `python`) and etc/
    python: str  # path of python3 inside the sandbox
    rootfs: str = ""
    share_net: bool = False
    proxy_socket: str = ""  # host path, for network "proxy-only"; its directory is bound in
    harness: bool = False  # bind shared_dir/harness (the example harnesses) at HARNESS_DIR
    bundles: str = ""  # host directory of the harness bundles, bound read-only at BUNDLES_DIR
    tmp_size_mb: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    # (info fd, block fd) when the agent and commands get two users: bwrap writes the child's pid to the
    # first and waits on the second until the creator has written the user namespace's two-uid map.
    uid_map_fds: tuple[int, int] | None = None
    seccomp_fd: int | None = None  # a descriptor holding the compiled filter (seccomp.py), inherited by bwrap
    # The workspace's size when the host could not mount its tmpfs (not root): bwrap mounts one at WORKSPACE
    # instead of binding paths.workspace (see quota.py). None: paths.workspace is bound (root: a host tmpfs).
    workspace_tmpfs_mb: int | None = None


def supervisor_argv(launch: Launch, *, cgroup_dirs: list[str], bwrap: str, setpriv: list[str]) -> list[str]:
    """`sh -c SUPERVISOR_SCRIPT ...`; `setpriv` is the privilege-dropping prefix (empty when not root)."""
    return ["/bin/sh", "-c", SUPERVISOR_SCRIPT, "trove-sandbox", launch.paths.dir, str(len(cgroup_dirs)),
            *cgroup_dirs, *setpriv, bwrap, *bwrap_args(launch)]


def bwrap_args(launch: Launch) -> list[str]:
    """bubblewrap's options and the agent command (see the module docstring for the resulting view)."""
    return [
        *namespace_args(launch),
        *environment_args(launch),
        *system_binds(launch.rootfs or "/"),
        *etc_binds(launch),
        "--proc", "/proc", "--dev", "/dev", *quota.tmpfs_size_args(quota.SHM_MB), *tmpfs_perms(launch),
        "--tmpfs", "/dev/shm",
        *(["--size", str(launch.tmp_size_mb * 1024 * 1024)] if launch.tmp_size_mb else []),
        *tmpfs_perms(launch), "--tmpfs", "/tmp",
        *workspace_args(launch),
        # Made explicitly (0755): the parents bwrap makes for a bind are 0700, closed to the commands' uid.
        "--dir", "/opt/trove",
        "--ro-bind", os.path.join(launch.shared_dir, agent_file(launch)), AGENT_PATH,
        *(["--ro-bind", os.path.join(launch.shared_dir, "harness"), HARNESS_DIR] if launch.harness else []),
        *(["--ro-bind", launch.bundles, BUNDLES_DIR] if launch.bundles else []),
        *(["--ro-bind", os.path.dirname(launch.proxy_socket), PROXY_DIR] if launch.proxy_socket else []),
        "--remount-ro", "/",
        "--chdir", WORKSPACE,
        *seccomp_args(launch),
        "--json-status-fd", "3",
        "--",
        *agent_command(launch),
    ]


def namespace_args(launch: Launch) -> list[str]:
    common = ["--unshare-all", "--unshare-user", *(["--share-net"] if launch.share_net else []),
              "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    if launch.uid_map_fds is None:
        return [*common, "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    info_fd, block_fd = launch.uid_map_fds
    return [*common, "--info-fd", str(info_fd), "--userns-block-fd", str(block_fd),
            *AGENT_CAPS, "--uid", str(AGENT_UID), "--gid", str(AGENT_UID)]


# What the agent keeps (in the sandbox's user namespace only): switching its children to the commands' user,
# and killing a command's process group at a timeout (which is no longer its own uid).
AGENT_CAPS = ("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_KILL")


def uid_map(agent_host_uid: int, command_host_uid: int) -> str:
    """The two-user map written to /proc/<bwrap's child>/uid_map and gid_map (uid and gid are equal)."""
    return f"{AGENT_UID} {agent_host_uid} 1\n{SANDBOX_UID} {command_host_uid} 1\n"


def tmpfs_perms(launch: Launch) -> list[str]:
    """With two users the agent's uid mounts the tmpfs: world-writable and sticky, like a host's /tmp."""
    return ["--perms", "1777"] if launch.uid_map_fds is not None else []


def workspace_args(launch: Launch) -> list[str]:
    if launch.workspace_tmpfs_mb is not None:
        return [*quota.tmpfs_size_args(launch.workspace_tmpfs_mb), *tmpfs_perms(launch), "--tmpfs", WORKSPACE]
    return ["--bind", launch.paths.workspace, WORKSPACE]


def seccomp_args(launch: Launch) -> list[str]:
    """bwrap reads the program from the descriptor and loads it just before it executes the agent."""
    return ["--seccomp", str(launch.seccomp_fd)] if launch.seccomp_fd is not None else []


def environment_args(launch: Launch) -> list[str]:
    env = {**BASE_ENV, "TROVE_SANDBOX": launch.name}
    if launch.proxy_socket:
        env["TROVE_PROXY_URL"] = f"http://127.0.0.1:{PROXY_PORT}"
    env.update(launch.env)
    args = ["--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def system_binds(base: str) -> list[str]:
    """Read-only binds of the system directories of `base` ("/" for the host); symlinks such as
    /bin -> usr/bin (merged /usr) are recreated as symlinks."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        source = os.path.join(base, name)
        if os.path.islink(source):
            args += ["--symlink", os.readlink(source), f"/{name}"]
        elif os.path.isdir(source):
            args += ["--ro-bind", source, f"/{name}"]
    return args


def etc_binds(launch: Launch) -> list[str]:
    if launch.rootfs:
        return ["--ro-bind", os.path.join(launch.rootfs, "etc"), "/etc"]
    # bwrap makes the parent of a file bind 0700, owned by the uid it sets up as: with two users that is the
    # agent's, and commands could not read /etc/passwd or /etc/gitconfig. Made first, explicitly 0755.
    args: list[str] = ["--perms", "0755", "--dir", "/etc"]
    for name in GENERATED_ETC:
        args += ["--ro-bind", os.path.join(launch.shared_dir, "etc", name), f"/etc/{name}"]
    for name in HOST_ETC + (("resolv.conf",) if launch.share_net else ()):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def agent_file(launch: Launch) -> str:
    """The agent as bytecode compiled for the host's python (saves ~8 ms of CPU per start: compiling
    agent.py is most of its start-up cost); as source under a `rootfs`, whose python may differ."""
    return "agent.py" if launch.rootfs else "agent.pyc"


def agent_command(launch: Launch) -> list[str]:
    # -I -S: no user site, no site-packages, no environment influence, and a faster start.
    command = [launch.python, "-I", "-S", AGENT_PATH, "--listen", "stdin", "--workspace", WORKSPACE]
    if launch.uid_map_fds is not None:
        command += ["--run-as", f"{SANDBOX_UID}:{SANDBOX_UID}"]
    if launch.proxy_socket:
        inside = f"{PROXY_DIR}/{os.path.basename(launch.proxy_socket)}"
        command += ["--forward", f"tcp:127.0.0.1:{PROXY_PORT}=unix:{inside}"]
    return command
