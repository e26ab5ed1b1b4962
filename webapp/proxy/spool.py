"""A local append-only spool for call records the queue could not take.

Records are JSON lines in segment files under one directory, each segment written by one process and
fsync'd after every append, so a record the proxy spooled survives the proxy's crash. A writer holds an
exclusive `flock` on its open segment; `drain_spool` only takes segments it can lock, which are those whose
writer sealed them or died (the kernel drops the lock with the process), so it never races a live writer.

Delivery is at least once: a segment is deleted only after every record in it was sent, and a drain that
fails half-way sends the whole segment again next time. Receivers dedupe by `call_id`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from webapp.proxy.records import CallRecord

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".jsonl"
_TMP_SUFFIX = ".tmp"
_STALE_TMP_SECONDS = 3600.0


class Spool:
    """Append-only writer of JSONL segments for one process. Thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_max_bytes: int = 16 * 1024 * 1024):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segment_max_bytes = segment_max_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._counter = 0

    def append(self, records: list[CallRecord]) -> None:
        """Write the records durably (fsync'd) before returning."""
        if not records:
            return
        data = b"".join(record.to_json() + b"\n" for record in records)
        with self._lock:
            fd = self._active_segment()
            os.write(fd, data)
            os.fsync(fd)
            self._size += len(data)
            if self._size >= self._segment_max_bytes:
                self._seal_locked()

    def seal(self) -> None:
        """Close the open segment so that a drain can take it; the next append opens a new one."""
        with self._lock:
            self._seal_locked()

    close = seal

    def _active_segment(self) -> int:
        if self._fd is None:
            self._fd = self._open_segment()
            self._size = 0
        return self._fd

    def _open_segment(self) -> int:
        # Created under a temporary name and locked before it gets a name a drain looks at, so a drain
        # never locks (and deletes) a segment between its creation and its writer's lock.
        self._counter += 1
        stem = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}-{self._counter}"
        tmp_path = self.directory / f".{stem}{_TMP_SUFFIX}"
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp_path, self.directory / f"{stem}{SEGMENT_SUFFIX}")
        _fsync_directory(self.directory)
        return fd

    def _seal_locked(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


@dataclass
class DrainResult:
    sent: int = 0  # records handed to send_batch (a resent segment counts again)
    segments: int = 0  # segments fully sent and deleted
    skipped_lines: int = 0  # torn or unreadable lines left behind by a crash


def drain_spool(
    *,
    directory: str | os.PathLike[str],
    send_batch: Callable[[list[CallRecord]], None],
    batch_size: int = 500,
) -> DrainResult:
    """Send every sealed segment's records with `send_batch`, deleting each segment once it is sent.

    Raises whatever `send_batch` raises; the segment being sent stays on disk for the next drain.
    Segments held by a live writer are skipped.
    """
    result = DrainResult()
    path = Path(directory)
    if not path.is_dir():
        return result
    _remove_stale_tmp(path)
    for segment in sorted(path.glob(f"*{SEGMENT_SUFFIX}")):
        _drain_segment(segment, send_batch, batch_size, result)
    return result


def spooled_segments(directory: str | os.PathLike[str]) -> list[Path]:
    path = Path(directory)
    return sorted(path.glob(f"*{SEGMENT_SUFFIX}")) if path.is_dir() else []


def _drain_segment(
    segment: Path, send_batch: Callable[[list[CallRecord]], None], batch_size: int, result: DrainResult
) -> None:
    try:
        fd = os.open(segment, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # another drain took it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live writer holds it
        if os.fstat(fd).st_nlink == 0:
            return  # another drain sent and deleted it after we opened it
        records, skipped = _read_records(fd, segment)
        for start in range(0, len(records), batch_size):
            batch = records[start : start + batch_size]
            send_batch(batch)
            result.sent += len(batch)
        segment.unlink()
        _fsync_directory(segment.parent)
        result.segments += 1
        result.skipped_lines += skipped
    finally:
        os.close(fd)


def _read_records(fd: int, segment: Path) -> tuple[list[CallRecord], int]:
    with os.fdopen(os.dup(fd), "rb") as handle:
        lines = handle.read().split(b"\n")
    # A segment always ends with a newline; a non-empty last piece is a write torn by a crash.
    torn = 1 if lines[-1] else 0
    records: list[CallRecord] = []
    skipped = torn
    for line in lines[:-1]:
        try:
            records.append(CallRecord.from_json(line))
        except (ValueError, KeyError, TypeError):
            skipped += 1
    if skipped:
        log.warning("spool segment %s: %d unreadable line(s) skipped", segment.name, skipped)
    return records, skipped


def _remove_stale_tmp(directory: Path) -> None:
    cutoff = time.time() - _STALE_TMP_SECONDS
    for tmp in directory.glob(f".*{_TMP_SUFFIX}"):
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
        except FileNotFoundError:
            pass


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
