"""Per-sandbox cgroups for the local backend: CPU, memory and pids limits.

One cgroup per sandbox, named after it, in each hierarchy whose controller has a limit to hold (pids always:
it is also how every process of a sandbox is found and killed): the cgroup v2 (unified) hierarchy for a
controller that is enabled there, else the controller's v1 hierarchy. Hosts mix the two (these machines
have memory/pids/cpu on v1 and an empty v2), so the choice is made per controller.

Where sandbox cgroups go: `parent` (default "trove") below the creating process's own cgroup in each
hierarchy, so sandboxes stay accounted to whoever runs Trove (a service's or a session's memory cgroup).
An absolute `parent` ("/trove") is taken from each hierarchy's root instead. On v2 a process's own cgroup
usually holds processes and so cannot delegate controllers to children; give an absolute `parent` that is
a delegated subtree there (systemd `Delegate=yes`).

Destroying is `kill_and_remove(dirs)`, a plain function over the directories recorded at creation, so a
process other than the creator (the reconciler) can do it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
_warned = False


class CgroupError(Exception):
    """A sandbox cgroup could not be created or limited."""


@dataclass(frozen=True)
class Limits:
    cpu: float | None = None  # cores
    memory_mb: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Home:
    """Where one controller's sandbox cgroups are made."""

    controller: str
    version: int  # 1 or 2
    parent: str  # absolute directory that receives one child per sandbox


class CgroupManager:
    """Finds the hierarchies once, then creates limited cgroups for sandboxes. Thread-safe after __init__."""

    def __init__(self, parent: str = "trove", *, enabled: bool = True, mounts_file: str = "/proc/self/mountinfo",
                 own_file: str = "/proc/self/cgroup") -> None:
        self.homes: dict[str, Home] = {}
        self.problems: list[str] = [] if enabled else ["cgroups disabled by configuration"]
        if enabled:
            v1_mounts, v2_mount = _read_mounts(mounts_file)
            own = _read_own_cgroups(own_file)
            for controller in CONTROLLERS:
                self._find_home(controller, parent, v1_mounts, v2_mount, own)
        if self.problems:
            _warn_once("sandbox resource limits are NOT fully enforced: " + "; ".join(self.problems))

    @property
    def enforced(self) -> bool:
        """True when memory, pids and cpu limits can all be applied."""
        return all(c in self.homes for c in CONTROLLERS)

    def dirs_for(self, name: str) -> list[str]:
        """The cgroup directories sandbox `name` has (or would have) under this manager."""
        return sorted({os.path.join(home.parent, name) for home in self.homes.values()})

    def create(self, name: str, limits: Limits) -> list[str]:
        """Create the cgroup directories for sandbox `name` and write `limits` into them. Returns the
        directories (one per hierarchy used). A stale directory of the same name (a crashed destroy) is
        removed and made afresh. On failure removes what it made and raises CgroupError."""
        made: list[str] = []
        try:
            for home in self._homes_for(limits):
                path = os.path.join(home.parent, name)
                if path not in made:
                    _make_fresh(path)
                    made.append(path)
                _write_limit(path, home, limits)
        except (OSError, CgroupError) as exc:
            kill_and_remove(made)
            raise CgroupError(f"cgroup for {name}: {exc}") from exc
        return made

    def _homes_for(self, limits: Limits) -> list[Home]:
        """The controllers that have a limit to hold, plus pids always: every sandbox gets one cgroup that
        tracks all its processes (destroy kills through it). Each extra v1 hierarchy costs a migration,
        which waits for an RCU grace period, so unlimited controllers are skipped."""
        wanted = {"pids"} | {c for c, v in (("memory", limits.memory_mb), ("cpu", limits.cpu)) if v is not None}
        homes = [home for controller, home in self.homes.items() if controller in wanted]
        return homes or list(self.homes.values())[:1]

    def _find_home(self, controller: str, parent: str, v1_mounts: dict[str, str], v2_mount: str | None,
                   own: dict[str, str]) -> None:
        if v2_mount and controller in _v2_available(v2_mount):
            self._try_home(Home(controller, 2, _parent_dir(v2_mount, own.get("", "/"), parent)))
        elif controller in v1_mounts:
            self._try_home(Home(controller, 1, _parent_dir(v1_mounts[controller], own.get(controller, "/"),
                                                           parent)))
        else:
            self.problems.append(f"no {controller} controller mounted")

    def _try_home(self, home: Home) -> None:
        try:
            os.makedirs(home.parent, exist_ok=True)
            if home.version == 2:
                _delegate_v2(home.parent, home.controller)
            if not os.access(os.path.join(home.parent, "cgroup.procs"), os.W_OK):
                raise PermissionError(f"cannot write {home.parent}/cgroup.procs")
        except OSError as exc:
            self.problems.append(f"{home.controller} (v{home.version} at {home.parent}): {exc}")
            return
        self.homes[home.controller] = home


def kill_and_remove(dirs: list[str], *, timeout: float = 5.0) -> list[str]:
    """SIGKILL every process in the cgroups `dirs`, then remove them. Idempotent; missing directories are
    fine. Returns the directories that could not be removed within `timeout` (empty on success)."""
    deadline = time.monotonic() + timeout
    left = [d for d in dirs if os.path.isdir(d)]
    delay = 0.0005
    while left:
        for path in left:
            _kill_members(path)
        left = [d for d in left if not _try_rmdir(d)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return left


def member_pids(dirs: list[str]) -> set[int]:
    """Pids currently in any of the cgroups `dirs`."""
    pids: set[int] = set()
    for path in dirs:
        pids |= _read_pids(path)
    return pids


# ---------------------------------------------------------------- helpers


def _read_mounts(mounts_file: str) -> tuple[dict[str, str], str | None]:
    """({v1 controller: mount point}, v2 mount point or None) from /proc/self/mountinfo."""
    v1: dict[str, str] = {}
    v2 = None
    with open(mounts_file) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mount_point = left.split()[4]
            fstype, _source, options = right.split()[:3]
            if fstype == "cgroup2":
                v2 = mount_point
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in CONTROLLERS:
                        v1[option] = mount_point
    return v1, v2


def _read_own_cgroups(own_file: str) -> dict[str, str]:
    """{controller: path} for v1 and {"": path} for v2, from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with open(own_file) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _v2_available(mount: str) -> set[str]:
    try:
        with open(os.path.join(mount, "cgroup.controllers")) as f:
            return set(f.read().split())
    except OSError:
        return set()


def _parent_dir(mount: str, own_path: str, parent: str) -> str:
    base = "/" if parent.startswith("/") else own_path
    return os.path.normpath(os.path.join(mount, base.lstrip("/"), parent.lstrip("/")))


def _delegate_v2(parent: str, controller: str) -> None:
    """Enable `controller` on every level from the hierarchy root down to `parent`, so `parent`'s children
    get it. Fails (EBUSY) where a level holds processes: v2's no-internal-processes rule."""
    levels = []
    path = parent
    while os.path.exists(os.path.join(path, "cgroup.subtree_control")):
        levels.append(path)
        if os.path.ismount(path):
            break
        path = os.path.dirname(path)
    for level in reversed(levels):
        with open(os.path.join(level, "cgroup.subtree_control")) as f:
            if controller in f.read().split():
                continue
        with open(os.path.join(level, "cgroup.subtree_control"), "w") as f:
            f.write(f"+{controller}")


def _make_fresh(path: str) -> None:
    """mkdir `path`; a stale one (left by a crashed destroy) is emptied and remade so no old limit stays."""
    if os.path.isdir(path) and kill_and_remove([path]):
        raise CgroupError(f"stale cgroup {path} cannot be removed")
    os.mkdir(path)


def _write_limit(path: str, home: Home, limits: Limits) -> None:
    for filename, value in _limit_files(home, limits):
        _write(os.path.join(path, filename), value)
    if home.controller == "memory" and limits.memory_mb is not None:
        # No swapping around the limit where the kernel accounts swap (absent here: no swap configured).
        swap_file = "memory.memsw.limit_in_bytes" if home.version == 1 else "memory.swap.max"
        swap_value = str(limits.memory_mb * 1024 * 1024) if home.version == 1 else "0"
        if os.path.exists(os.path.join(path, swap_file)):
            _write(os.path.join(path, swap_file), swap_value)


def _limit_files(home: Home, limits: Limits) -> list[tuple[str, str]]:
    if home.controller == "memory" and limits.memory_mb is not None:
        memory = str(limits.memory_mb * 1024 * 1024)
        return [("memory.max" if home.version == 2 else "memory.limit_in_bytes", memory)]
    if home.controller == "pids" and limits.pids is not None:
        return [("pids.max", str(limits.pids))]
    if home.controller == "cpu" and limits.cpu is not None:
        quota = max(1000, int(limits.cpu * CPU_PERIOD_US))
        if home.version == 2:
            return [("cpu.max", f"{quota} {CPU_PERIOD_US}")]
        return [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))]
    return []


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_pids(path: str) -> set[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return {int(line) for line in f if line.strip()}
    except OSError:
        return set()


def _kill_members(path: str) -> None:
    kill_file = os.path.join(path, "cgroup.kill")  # v2, Linux 5.14+: kills atomically, forks included
    if os.path.exists(kill_file):
        try:
            _write(kill_file, "1")
            return
        except OSError:
            pass
    for pid in _read_pids(path):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _try_rmdir(path: str) -> bool:
    """True once `path` is gone. A cgroup directory with live members refuses removal (EBUSY)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning(message)
