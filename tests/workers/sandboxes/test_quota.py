"""The workspace's size limit (disk_mb), attacked from inside real sandboxes: a sandbox writes far past its
quota and must be stopped with ENOSPC, with nothing of it on the host disk, and destroy leaves no mount."""

from __future__ import annotations

import os
import uuid

import pytest

from workers.sandboxes import quota
from workers.sandboxes.base import SandboxSpec

MIB = 1024 * 1024
WRITE_60_MB = "head -c 60000000 /dev/zero > big; echo \"exit $?\"; stat -c %s big"


@pytest.fixture
def make_sandbox(backend):
    names = []

    def make(**fields):
        names.append(f"q-{uuid.uuid4().hex[:10]}")
        return backend.create(SandboxSpec(name=names[-1], **fields))

    yield make
    for name in names:
        backend.destroy(name)


def bytes_on_host_disk(directory: str) -> int:
    """Bytes of the files under `directory` on its own filesystem (a tmpfs mounted below is not the disk)."""
    device = os.stat(directory).st_dev
    total = 0
    for parent, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(parent, d)).st_dev == device]
        total += sum(os.lstat(os.path.join(parent, f)).st_blocks * 512 for f in files)
    return total


def mounts_under(directory: str) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line for line in f if directory in line]


def test_a_sandbox_cannot_write_60_mb_into_a_5_mb_workspace(backend, make_sandbox):
    handle = make_sandbox(disk_mb=5)

    result = backend.exec(handle, WRITE_60_MB, timeout=60)

    status, size = result.stdout.split("\n")[0], int(result.stdout.split("\n")[1])
    assert status != "exit 0" and "No space left on device" in result.stderr
    assert size <= 5 * MIB
    assert bytes_on_host_disk(os.path.join(backend.root, handle.name)) < MIB


def test_the_limit_counts_files_too_not_only_bytes(backend, make_sandbox):
    handle = make_sandbox(disk_mb=5)
    script = ("import os\nn = 0\ntry:\n    while n < 100000:\n        open(f'f{n}', 'w').close(); n += 1\n"
              "except OSError as e:\n    print(n, e.strerror)\n")
    backend.write_file(handle, "many.py", script.encode())

    created, reason = backend.exec(handle, "python3 many.py", timeout=120).stdout.split(" ", 1)

    assert int(created) < 100000 and reason.strip() == "No space left on device"


def test_dev_shm_is_bounded_too(backend, make_sandbox):
    handle = make_sandbox(disk_mb=5)

    result = backend.exec(handle, "head -c 100000000 /dev/zero > /dev/shm/big; stat -c %s /dev/shm/big")

    assert "No space left on device" in result.stderr
    assert int(result.stdout) <= quota.SHM_MB * MIB


def test_a_full_workspace_leaves_the_sandbox_usable(backend, make_sandbox):
    handle = make_sandbox(disk_mb=5)
    backend.exec(handle, WRITE_60_MB, timeout=60)

    result = backend.exec(handle, "rm big && echo ok > small && cat small")

    assert result.stdout == "ok\n"


def test_destroy_removes_the_workspace_mount(backend, make_sandbox):
    handle = make_sandbox(disk_mb=5)
    directory = os.path.join(backend.root, handle.name)
    backend.exec(handle, "head -c 1000000 /dev/zero > some")

    backend.destroy(handle.name)

    assert mounts_under(directory) == [] and not os.path.exists(directory)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts the workspace on the host")
def test_a_mount_left_by_a_creator_that_died_is_removed_by_destroy(backend):
    name = f"q-{uuid.uuid4().hex[:10]}"
    directory = os.path.join(backend.root, name)
    os.makedirs(os.path.join(directory, "workspace"))
    quota.mount_workspace(os.path.join(directory, "workspace"), 5)  # what _launch does before it died
    assert mounts_under(directory)

    backend.destroy(name)

    assert mounts_under(directory) == [] and not os.path.exists(directory)


def test_without_host_mounts_bubblewrap_mounts_the_limited_workspace_itself(backend, make_sandbox):
    backend.host_workspace_mounts = False  # what an unprivileged Trove (or root without CAP_SYS_ADMIN) gets
    try:
        handle = make_sandbox(disk_mb=5)
        result = backend.exec(handle, WRITE_60_MB, timeout=60)
        ownership = backend.exec(handle, "stat -c %u /workspace; id -u").stdout.split()
    finally:
        backend.host_workspace_mounts = quota.host_mounts_work(backend.shared_dir)

    assert "No space left on device" in result.stderr and int(result.stdout.split("\n")[1]) <= 5 * MIB
    assert os.listdir(os.path.join(backend.root, handle.name, "workspace")) == []  # nothing reached the host
    assert backend.exec(handle, "touch mine && echo ok").stdout == "ok\n", ownership
