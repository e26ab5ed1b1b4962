"""The sandbox seccomp filter, attacked from inside real bubblewrap sandboxes.

Each denied syscall is made from Python (ctypes syscall()) inside a sandbox and must fail with EPERM. Many of
them would fail in the sandbox anyway (no capabilities); a control run of the same probe outside the filter
shows that a good part of them (keyctl, add_key, ptrace, process_vm_readv, setns, personality, ...) do not,
so these tests fail if the filter stops being loaded. Syscall numbers come from the kernel's ABI (below),
not from the library that builds the filter.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import signal
import subprocess
import tempfile
import textwrap
import uuid

import pytest

from workers.sandboxes.base import SandboxSpec
from workers.sandboxes.local import DEFAULT_HOST_UID

# The kernel's syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h).
SYSCALLS = {
    "x86_64": {
        "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165,
        "umount2": 166, "pivot_root": 155, "fsopen": 430, "setns": 308, "unshare": 272, "clone": 56, "clone3": 435,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "swapon": 167,
        "swapoff": 168, "acct": 163, "settimeofday": 164, "clock_settime": 227, "syslog": 103, "iopl": 172,
        "personality": 135, "getpid": 39, "pidfd_getfd": 438, "process_madvise": 440, "modify_ldt": 154,
    },
    "aarch64": {
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40,
        "umount2": 39, "pivot_root": 41, "fsopen": 430, "setns": 268, "unshare": 97, "clone": 220, "clone3": 435,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "swapon": 224,
        "swapoff": 225, "acct": 89, "settimeofday": 170, "clock_settime": 112, "syslog": 116,
        "personality": 92, "getpid": 172, "pidfd_getfd": 438, "process_madvise": 440,
    },
}
ARCH = platform.machine()
pytestmark = pytest.mark.skipif(ARCH not in SYSCALLS, reason=f"no syscall table for {ARCH} in this test")

# probe label -> (syscall, arguments). Strings are passed as pointers; arguments are harmless: nothing here
# changes the host even where a call succeeds (the control run below runs them unfiltered).
PROBE = textwrap.dedent(r'''
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    NR = json.loads(sys.argv[1])
    S = ctypes.c_char_p
    handle = ctypes.create_string_buffer(8)  # struct file_handle with handle_bytes = 0: EOVERFLOW unfiltered
    mount_id = ctypes.create_string_buffer(4)
    PROBES = {
        "keyctl": ("keyctl", 0, -2, 0),
        "add_key": ("add_key", S(b"user"), S(b"trove-probe"), S(b"x"), 1, -2),
        "request_key": ("request_key", S(b"user"), S(b"trove-absent"), 0, 0),
        "bpf": ("bpf", 0, 0, 0),
        "perf_event_open": ("perf_event_open", 0, 0, -1, -1, 0),
        "userfaultfd": ("userfaultfd", 1),
        "io_uring_setup": ("io_uring_setup", 1, 0),
        "ptrace": ("ptrace", 2, 0x3FFFFFF0, 0, 0),
        "process_vm_readv": ("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0),
        "process_vm_writev": ("process_vm_writev", os.getpid(), 0, 0, 0, 0, 0),
        "pidfd_getfd": ("pidfd_getfd", -1, 0, 0),
        "process_madvise": ("process_madvise", -1, 0, 0, 0, 0),
        "modify_ldt": ("modify_ldt", 0, 0, 0),  # read the LDT into a 0-byte buffer: 0 unfiltered
        "mount": ("mount", S(b"none"), S(b"/tmp"), S(b"tmpfs"), 0, 0),
        "umount2": ("umount2", S(b"/tmp"), 0),
        "pivot_root": ("pivot_root", S(b"/tmp"), S(b"/tmp")),
        "fsopen": ("fsopen", S(b"tmpfs"), 0),
        "setns": ("setns", -1, 0),
        "unshare-user": ("unshare", 0x10000000),
        "unshare-mount": ("unshare", 0x00020000),
        "unshare-net": ("unshare", 0x40000000),
        "clone-user": ("clone", 0x10000000 | 17, 0, 0, 0, 0),
        "clone-pid": ("clone", 0x20000000 | 17, 0, 0, 0, 0),
        "open_by_handle_at": ("open_by_handle_at", -1, 0, 0),
        "name_to_handle_at": ("name_to_handle_at", -100, S(b"/"), handle, mount_id, 0),
        "init_module": ("init_module", 0, 0, S(b"")),
        "finit_module": ("finit_module", -1, S(b""), 0),
        "delete_module": ("delete_module", S(b"trove_absent"), 0),
        "kexec_load": ("kexec_load", 0, 0, 0, 0),
        "kexec_file_load": ("kexec_file_load", -1, -1, 0, S(b""), 0),
        "reboot": ("reboot", 0, 0, 0, 0),  # wrong magic numbers: EINVAL even where allowed
        "swapon": ("swapon", S(b"/nonexistent"), 0),
        "swapoff": ("swapoff", S(b"/nonexistent")),
        "acct": ("acct", 0),
        "settimeofday": ("settimeofday", 0, 0),
        "clock_settime": ("clock_settime", 0, 0),
        "syslog": ("syslog", 10, 0, 0),
        "iopl": ("iopl", 0),
        "personality-no-aslr": ("personality", 0x0040000),
        "personality-exec-data": ("personality", 0x0400000),
        "personality-query": ("personality", 0xFFFFFFFF),
        "clone3": ("clone3", 0, 0),
    }

    def run(label):
        name, *args = PROBES[label]
        args = [a if isinstance(a, (S, ctypes.Array)) else ctypes.c_long(a) for a in args]
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(NR[name]), *args)
        if name == "clone" and result == 0:
            os._exit(0)  # the clone succeeded and this is the child
        if name == "clone" and result > 0:
            os.waitpid(result, 0)
        if name == "personality" and result != -1:
            libc.syscall(ctypes.c_long(NR[name]), ctypes.c_long(0))  # back to PER_LINUX
        return ctypes.get_errno() if result == -1 else 0

    print(json.dumps({label: run(label) for label in sys.argv[2:]}))
''')

DENIED = [
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "ptrace",
    "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "mount", "umount2", "pivot_root", "fsopen", "setns",
    "unshare-user", "unshare-mount", "unshare-net", "clone-user", "clone-pid", "open_by_handle_at",
    "name_to_handle_at", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "syslog",
    "personality-no-aslr", "personality-exec-data", "personality-query",
] + (["iopl", "modify_ldt"] if ARCH == "x86_64" else [])
# Calls that an unprivileged process without the filter makes without EPERM: they prove the filter acts.
ALLOWED_WITHOUT_FILTER = [
    "keyctl", "add_key", "request_key", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev",
    "setns", "name_to_handle_at", "clock_settime", "personality-no-aslr", "personality-exec-data", "clone3",
    "pidfd_getfd", "process_madvise",
] + (["modify_ldt"] if ARCH == "x86_64" else [])


@pytest.fixture(scope="module")
def sandbox(backend):
    name = f"sc-{uuid.uuid4().hex[:10]}"
    handle = backend.create(SandboxSpec(name=name))
    backend.write_file(handle, "probe.py", PROBE.encode())
    yield handle
    backend.destroy(name)


def probe_in_sandbox(backend, handle, labels: list[str]) -> dict[str, int]:
    numbers = json.dumps(SYSCALLS[ARCH])
    result = backend.exec(handle, f"python3 -I probe.py '{numbers}' {' '.join(labels)}", timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def probe_unfiltered(labels: list[str]) -> dict[str, int]:
    """The same probe as an unprivileged process outside any sandbox (the sandbox uid, no filter)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir="/tmp", delete=False) as script:
        script.write(PROBE)
    os.chmod(script.name, 0o644)
    try:
        prefix = ["setpriv", f"--reuid={DEFAULT_HOST_UID}", f"--regid={DEFAULT_HOST_UID}", "--clear-groups"]
        done = subprocess.run([*(prefix if os.geteuid() == 0 else []), "/usr/bin/python3", "-I", script.name,
                               json.dumps(SYSCALLS[ARCH]), *labels], capture_output=True, text=True, timeout=60,
                              cwd="/tmp")
    finally:
        os.unlink(script.name)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_denied_syscall_fails_with_eperm_inside_a_sandbox(backend, sandbox):
    errors = probe_in_sandbox(backend, sandbox, DENIED)

    assert {label: errno.errorcode.get(code, code) for label, code in errors.items() if code != errno.EPERM} == {}


def test_the_same_calls_are_not_refused_without_the_filter():
    errors = probe_unfiltered(ALLOWED_WITHOUT_FILTER)

    assert [label for label, code in errors.items() if code == errno.EPERM] == []


def test_clone3_answers_enosys_so_that_glibc_falls_back_to_clone(backend, sandbox):
    assert probe_in_sandbox(backend, sandbox, ["clone3"]) == {"clone3": errno.ENOSYS}


def test_the_safe_personalities_stay_allowed(backend, sandbox):
    script = (f"import ctypes; libc = ctypes.CDLL(None, use_errno=True); nr = {SYSCALLS[ARCH]['personality']}; "
              "print([libc.syscall(nr, ctypes.c_long(v)) != -1 for v in (0x8, 0x20000, 0x20008, 0)])")

    result = backend.exec(sandbox, f'python3 -c "{script}"')

    assert result.stdout.strip() == "[True, True, True, True]", result.stderr


def test_every_sandbox_process_runs_under_the_filter(backend, sandbox):
    result = backend.exec(sandbox, "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; "
                                   "grep -E '^Seccomp:' /proc/1/status")

    assert result.stdout.split() == ["NoNewPrivs:", "1", "Seccomp:", "2", "Seccomp:", "2"], result.stdout


@pytest.mark.skipif(ARCH != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_an_x32_syscall_kills_the_process(backend, sandbox):
    x32_getpid = 0x40000000 | SYSCALLS["x86_64"]["getpid"]
    script = f"import ctypes; ctypes.CDLL(None).syscall(ctypes.c_long({x32_getpid})); print('survived')"

    result = backend.exec(sandbox, f'python3 -c "{script}"; echo "exit $?"')

    assert "survived" not in result.stdout
    assert result.stdout.strip().endswith(f"exit {128 + signal.SIGSYS}")


I386_GETPID = textwrap.dedent("""
    import ctypes, mmap
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20 (getpid in the i386 ABI); int 0x80; ret
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    print("survived", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
""")


@pytest.mark.skipif(ARCH != "x86_64", reason="the i386 ABI on x86_64")
def test_a_syscall_through_the_i386_abi_kills_the_process(backend, sandbox):
    unfiltered = subprocess.run(["/usr/bin/python3", "-I", "-c", I386_GETPID], capture_output=True, text=True)
    if "survived" not in unfiltered.stdout:
        pytest.skip("this kernel has no i386 emulation: int 0x80 fails with or without the filter")
    backend.write_file(sandbox, "i386.py", I386_GETPID.encode())

    result = backend.exec(sandbox, 'python3 -I i386.py; echo "exit $?"')

    assert "survived" not in result.stdout
    assert result.stdout.strip().endswith(f"exit {128 + signal.SIGSYS}")


def test_ordinary_work_still_runs(backend, sandbox):
    backend.write_file(sandbox, "test_sum.py", textwrap.dedent("""
        import concurrent.futures, multiprocessing, subprocess, threading, unittest

        def square(n):
            return n * n

        class Work(unittest.TestCase):
            def test_threads(self):
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    self.assertEqual(sum(pool.map(square, range(10))), 285)

            def test_processes(self):
                with multiprocessing.get_context("fork").Pool(2) as pool:
                    self.assertEqual(pool.map(square, [1, 2, 3]), [1, 4, 9])

            def test_fork_and_exec(self):
                self.assertEqual(subprocess.run(["sh", "-c", "echo $((6 * 7))"], capture_output=True,
                                                text=True, check=True).stdout, "42\\n")
    """).encode())

    tests = backend.exec(sandbox, "python3 -m unittest -q test_sum 2>&1; echo exit $?", timeout=120)
    git = backend.exec(sandbox, "git init -q repo && cd repo && echo hi > f && git add f && "
                                "git -c user.email=t@t -c user.name=t commit -qm one && git log --oneline | wc -l")
    shell = backend.exec(sandbox, "seq 1000 | sort -rn | head -1; id -un")

    assert tests.stdout.strip().endswith("exit 0"), tests.stdout
    assert (git.stdout, git.exit_code) == ("1\n", 0), git.stderr
    assert shell.stdout == "1000\nsandbox\n"  # /etc/passwd readable by the commands' uid
