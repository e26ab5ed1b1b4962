"""The seccomp filter of every local sandbox: the syscalls container runtimes deny by default, as EPERM.

bubblewrap loads it (`--seccomp FD`, a compiled classic BPF program) in the sandbox's init and agent right
before it executes them, after its own namespace and mount setup, so bwrap itself is not restricted and
every process in the sandbox is (filters are inherited across fork and exec and cannot be removed).

The program is compiled by libseccomp (Debian's libseccomp2, which apt itself depends on, so it is on every
Debian machine) through its ctypes binding `pyseccomp`. libseccomp supplies what is easy to get wrong by
hand: the syscall numbers of the architecture, the architecture check (a syscall made through another ABI
on the same CPU, i386's `int 0x80` on x86_64 or AArch32 on aarch64, kills the process: the numbers differ
there and would slip past the rules) and, on x86_64, the x32 ABI check (numbers with bit 30 set kill too).
The filter is built for the machine's own architecture, so it holds on x86_64 and aarch64 alike.

It is a deny list (everything else is allowed), like flatpak's, rather than Docker's allow list: a syscall
added to the kernel later stays allowed, but nothing ordinary breaks. What it denies, and why:
- the kernel keyring, BPF, perf events, userfaultfd, io_uring: large kernel attack surface, not
  namespaced, and not needed by builds, tests or agents;
- ptrace, process_vm_readv/writev, process_madvise and pidfd_getfd: reading or steering another process (a
  command reading the harness's memory or taking its descriptors);
- mounting (the old and the new mount API), pivot_root, namespaces (setns; unshare and clone with namespace
  flags; clone3, whose flags live in memory a filter cannot read, answers ENOSYS so that glibc falls back
  to clone, as Docker's profile does), open_by_handle_at (the classic container breakout);
- modules, kexec, reboot, swap, accounting, quotas, the clock, the kernel log, I/O ports, the x86 LDT,
  legacy syscalls;
- personality() beyond PER_LINUX, PER_LINUX32 and UNAME26 (the others turn off ASLR, map page zero or make
  data executable).
Not denied, because the agent needs them to run commands under their own uid: setresuid/setresgid,
setgroups, capset, prctl, and seccomp itself (a process may only add filters).
Most of these calls would fail in the sandbox anyway (no capabilities, no nested user namespaces); the filter
is the second wall, and several of them (keyctl, add_key, ptrace, process_vm_readv, personality,
io_uring_setup) are allowed to an unprivileged process without it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os

# Namespace flags of clone(2) and unshare(2). CLONE_NEWTIME shares its bit with clone()'s exit-signal
# byte, so it is checked for unshare only (clone cannot request it).
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_NEWTIME = 0x00000080

# personality(2): the values Docker allows are PER_LINUX (0), PER_LINUX32 (0x8), UNAME26 (0x20000) and their
# combination. Every flag that weakens the process (ADDR_NO_RANDOMIZE 0x40000, MMAP_PAGE_ZERO, READ_IMPLIES_EXEC,
# ADDR_LIMIT_*, ...) is a bit above 0x20008, so "greater than 0x20008" plus "any low bit but 0x8" denies
# exactly the rest. The query personality(0xffffffff) is denied too (flatpak denies it as well): libseccomp
# cannot express "above 0x20008 but not 0xffffffff" in one rule, and nothing ordinary asks.
PERSONALITY_MAX_SAFE = 0x20008
PER_LINUX32 = 0x8
UNAME26 = 0x20000

DENIED = (
    # the kernel keyring (not namespaced: keys of other users and containers)
    "keyctl", "add_key", "request_key",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # other processes' memory and descriptors (each needs the same access as ptrace)
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
    # mounts and namespaces
    "mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "setns",
    # file handles: open_by_handle_at walks the whole filesystem past any bind mount
    "open_by_handle_at", "name_to_handle_at",
    # kernel modules and kexec
    "init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
    "kexec_load", "kexec_file_load",
    # the host: power, swap, accounting, quotas, the clock, the kernel log, I/O ports
    "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "settimeofday", "stime",
    "clock_settime", "clock_adjtime", "syslog", "ioperm", "iopl", "modify_ldt",
    # legacy and obsolete
    "_sysctl", "sysfs", "uselib", "ustat", "vm86", "vm86old", "lookup_dcookie", "nfsservctl",
)


class SeccompUnavailable(Exception):
    """The filter cannot be built (no libseccomp): sandboxes must not start without it."""


@functools.cache
def sandbox_filter() -> bytes:
    """The compiled BPF program (built once per process). Raises SeccompUnavailable."""
    seccomp = _library()
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    # A syscall through a foreign ABI (i386 or x32 on x86_64, AArch32 on aarch64) kills the whole process.
    program.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        _add(program, deny, name)
    for flag in CLONE_NAMESPACE_FLAGS.values():
        _add(program, deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for flag in (*CLONE_NAMESPACE_FLAGS.values(), CLONE_NEWTIME):
        _add(program, deny, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    _add(program, seccomp.ERRNO(errno.ENOSYS), "clone3")
    _add(program, deny, "personality", seccomp.Arg(0, seccomp.GT, PERSONALITY_MAX_SAFE))
    for bit in (1 << n for n in range(UNAME26.bit_length() - 1)):  # the bits below UNAME26 ...
        if bit != PER_LINUX32:  # ... except PER_LINUX32
            _add(program, deny, "personality", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
    return _export(program)


def program_fd(program: bytes) -> int:
    """A file descriptor holding `program`, positioned at its start, for `bwrap --seccomp FD`; the caller
    passes it to the child (pass_fds) and closes it. Numbered 10 or above so that it cannot collide with
    the descriptors the supervisor script redirects (0-3)."""
    memfd = os.memfd_create("trove-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(memfd, program)
        os.lseek(memfd, 0, os.SEEK_SET)
        return fcntl.fcntl(memfd, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(memfd)


def _library():
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding found no libseccomp.so
        raise SeccompUnavailable(
            f"cannot build the sandbox seccomp filter ({exc}): install the pyseccomp package and libseccomp "
            "(Debian: apt-get install libseccomp2)") from exc
    return pyseccomp


def _add(program, action: int, name: str, *conditions) -> None:
    try:
        program.add_rule(action, name, *conditions)
    except OSError as exc:  # a name this libseccomp does not know: refuse rather than leave it open
        raise SeccompUnavailable(f"libseccomp cannot add the seccomp rule for {name}: {exc}") from exc


def _export(program) -> bytes:
    with open(os.memfd_create("trove-seccomp-build", os.MFD_CLOEXEC), "w+b") as buffer:
        program.export_bpf(buffer)  # libseccomp writes to the descriptor itself
        buffer.seek(0)
        return buffer.read()
