"""The workspace's size limit (`disk_mb`) for local sandboxes: the workspace is a size-limited tmpfs.

A write past the limit fails with ENOSPC inside the sandbox, and nothing the sandbox writes reaches the host
disk (a host directory had no limit: `disk_mb=1` let a sandbox write 60 MB there). tmpfs pages are memory,
charged to the memory cgroup of the process that writes them, so the sandbox's `memory_mb` bounds them too:
a template needs room for its workspace in memory_mb.

Two ways, by privilege:
- Trove runs as root: a tmpfs of `disk_mb` is mounted on the host at the sandbox's workspace directory, owned
  like the directory it covers (the commands' host uid), and bound into the sandbox as before. The host
  sees the workspace, and destroy() unmounts it before it removes the directory; a mount left by a crashed
  creator is found and removed the same way (destroy() always unmounts).
- Otherwise (an unprivileged user, or root without CAP_SYS_ADMIN, cannot mount on the host): bubblewrap mounts a tmpfs of `disk_mb` at
  /workspace inside the sandbox's own mount namespace, owned by the sandbox user; it vanishes with the
  sandbox's last process, and the host directory stays empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import tempfile

MIB = 1024 * 1024
DEFAULT_DISK_MB = 1024  # a template's default disk_mb; the workspace of a spec without one
SHM_MB = 64  # /dev/shm, as Docker sizes it: POSIX shared memory, not a second unlimited workspace
# tmpfs counts inodes apart from bytes: without a cap, empty files would fill kernel memory past disk_mb.
INODES_PER_MB = 256  # an average file of 4 KiB
MIN_INODES = 4096
MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

_libc = ctypes.CDLL(None, use_errno=True)


class QuotaError(OSError):
    """The workspace's tmpfs could not be mounted."""


def host_mounts_work(scratch_dir: str) -> bool:
    """Whether this process may mount a tmpfs on the host (root with CAP_SYS_ADMIN: not so in a container
    without it), tried once on a scratch directory under `scratch_dir`."""
    if os.geteuid() != 0:
        return False
    probe = tempfile.mkdtemp(prefix=".mount-probe-", dir=scratch_dir)  # one per caller: threads may race here
    try:
        mount_workspace(probe, 1)
        unmount_workspace(probe)
        return True
    except QuotaError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def workspace_size_mb(disk_mb: int | None) -> int:
    return disk_mb if disk_mb else DEFAULT_DISK_MB


def mount_workspace(path: str, size_mb: int) -> None:
    """Mount a tmpfs of `size_mb` on the directory `path`, with the directory's owner and mode (root only).
    nosuid and nodev: nothing in a workspace is a device or gains privileges."""
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise QuotaError(errno.ENOTDIR, f"workspace {path} is not a directory")
    options = (f"size={size_mb}m,nr_inodes={max(MIN_INODES, size_mb * INODES_PER_MB)},"
               f"mode={stat.S_IMODE(st.st_mode):o},uid={st.st_uid},gid={st.st_gid}")
    if _libc.mount(b"trove-workspace", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        raise QuotaError(code, f"cannot mount the workspace tmpfs on {path}: {os.strerror(code)}")


def unmount_workspace(path: str) -> None:
    """Unmount what mount_workspace mounted on `path`; idempotent (nothing mounted, no directory: fine).
    Detached, so a process still holding a file there cannot keep the mount on the host."""
    if _libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
            raise QuotaError(code, f"cannot unmount the workspace tmpfs on {path}: {os.strerror(code)}")


def tmpfs_size_args(size_mb: int) -> list[str]:
    """bubblewrap's size option for the --tmpfs that follows it."""
    return ["--size", str(size_mb * MIB)]
