"""Sandbox cgroups: finding the hierarchies (v1, v2, hybrid) and removing a cgroup that still has members."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from workers.sandboxes import cgroups, procs
from workers.sandboxes.cgroups import CgroupManager, Limits, kill_and_remove, member_pids

V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 30 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
OWN_V1 = "4:memory:/session/abc\n8:pids:/\n1:cpu:/\n0::/\n"


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_mounts_and_own_cgroups_are_read_per_controller(tmp_path):
    mountinfo = write(tmp_path, "mountinfo", V1_MOUNTINFO)
    own = write(tmp_path, "cgroup", OWN_V1)

    v1, v2 = cgroups._read_mounts(mountinfo)
    own_paths = cgroups._read_own_cgroups(own)

    assert v1 == {"cpu": "/sys/fs/cgroup/cpu", "memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"}
    assert v2 == "/sys/fs/cgroup/unified"
    assert cgroups._parent_dir(v1["memory"], own_paths["memory"], "trove") == \
        "/sys/fs/cgroup/memory/session/abc/trove"
    assert cgroups._parent_dir(v1["pids"], own_paths["pids"], "/trove") == "/sys/fs/cgroup/pids/trove"


def test_a_missing_controller_is_reported_not_fatal(tmp_path):
    mountinfo = write(tmp_path, "mountinfo", "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n")
    own = write(tmp_path, "cgroup", "0::/\n")

    manager = CgroupManager("trove", mounts_file=mountinfo, own_file=own)

    assert not manager.enforced
    assert manager.homes == {}
    assert any("memory" in problem for problem in manager.problems)


def test_kill_and_remove_kills_members_and_removes_the_cgroups():
    manager = CgroupManager()
    if not manager.enforced:
        pytest.skip(f"cgroups unavailable here: {manager.problems}")
    name = f"cgtest-{uuid.uuid4().hex[:8]}"
    dirs = manager.create(name, Limits(memory_mb=64, pids=16, cpu=0.25))
    sleeper = subprocess.Popen(["sleep", "300"])
    for directory in dirs:
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
    assert sleeper.pid in member_pids(dirs)

    left = kill_and_remove(dirs)

    assert left == []
    assert sleeper.wait(timeout=10) == -9
    assert not any(os.path.exists(d) for d in dirs)
    assert kill_and_remove(dirs) == []  # idempotent


def test_process_identity_survives_only_while_the_process_lives():
    sleeper = subprocess.Popen(["sleep", "300"])
    started = procs.start_time(sleeper.pid)

    assert procs.is_alive(sleeper.pid, started)
    assert not procs.is_alive(sleeper.pid, started + 1)
    sleeper.kill()
    assert procs.wait_gone(lambda: not procs.is_alive(sleeper.pid, started), timeout=10)  # a zombie counts
    sleeper.wait()
