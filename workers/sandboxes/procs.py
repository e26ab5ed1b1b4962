"""Process identity on Linux, read from /proc: enough to kill the right process after its pid was recorded
by another process (pids get reused, so a pid is always checked against its start time or namespace)."""

from __future__ import annotations

import os
import signal
import time


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if there
    is no such process or it is a zombie (dead, only waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; count fields after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def is_alive(pid: int | None, started: int | None) -> bool:
    """True if `pid` is a live (not zombie) process that started at `started`."""
    return pid is not None and started is not None and start_time(pid) == started


def pid_namespace(pid: int) -> str | None:
    """e.g. 'pid:[4026532181]', or None if the process is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """Direct children of `pid` (needs CONFIG_PROC_CHILDREN; empty if unavailable or gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def kill(pid: int) -> None:
    """SIGKILL, ignoring a process that is already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_gone(check, *, timeout: float) -> bool:
    """Poll `check()` (true once the awaited thing is gone) with a short backoff. True if it came true."""
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (a leak check, not a hot path)."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found
