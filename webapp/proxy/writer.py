"""The one writer of proxy call records into the experience store, and where the unwritable ones go.

`write_call_records` is used by the in-process sink (embedded default) and by the Redis-stream ingest
(full stack). It is idempotent by call id (steps_append skips a call id it already stored), so a
redelivered batch or a replayed spool adds nothing.

Failures come in two kinds, and the difference decides whether a batch is retried:
- transient (the database is down, restarting, locked, or a connection broke): raised, so the caller
  retries the whole batch later (the sink's retries and spool, the stream's pending entries);
- permanent for one record (its trajectory no longer exists, a step the store refuses): the record is
  set aside in a dead letter with the reason, logged and counted, and the rest of the batch is written.
  Raising on these would hold the whole stream back for ever behind one record.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from django.db import DatabaseError, DataError, IntegrityError, NotSupportedError, connection

from experience.errors import NotFound
from experience.services.ingest import steps_append
from webapp.proxy.locations import dead_letter_path
from webapp.proxy.records import CallRecord

log = logging.getLogger("trove.proxy")

DeadLetter = Callable[[CallRecord, str, str], None]  # (record, reason, error message)
DEAD_LETTER_STREAM_MAXLEN = 100_000

# Reasons a record was set aside, counted over this process's life (a dead letter is never silent).
dead_lettered: Counter[str] = Counter()
_count_lock = threading.Lock()


@dataclass
class WriteOutcome:
    stored: int = 0  # steps created (a call id already stored counts nothing)
    dead_lettered: int = 0  # records set aside in the dead letter

    def add(self, other: WriteOutcome) -> None:
        self.stored += other.stored
        self.dead_lettered += other.dead_lettered


def write_call_records(records: list[CallRecord], *, dead_letter: DeadLetter | None = None) -> WriteOutcome:
    """Append the records to their trajectories as model_call steps, each trajectory's in time order.

    Idempotent by call id. Raises on transient database errors (nothing of the failing trajectory's group
    is written; retry the batch). A record that can never be written goes to `dead_letter` (default: the
    JSONL file `locations.dead_letter_path()`) and the rest are written. Does not open or close the
    caller's connection beyond dropping one found broken (outside a transaction), so a retry reconnects.
    """
    dead_letter = dead_letter or file_dead_letter(dead_letter_path())
    outcome = WriteOutcome()
    for trajectory_id, calls in _by_trajectory(records, dead_letter, outcome).items():
        calls.sort(key=lambda call: call.started_at)
        _write_group(trajectory_id, calls, dead_letter, outcome)
    return outcome


def _by_trajectory(
    records: list[CallRecord], dead_letter: DeadLetter, outcome: WriteOutcome
) -> dict[int, list[CallRecord]]:
    groups: dict[int, list[CallRecord]] = defaultdict(list)
    for record in records:
        try:
            groups[int(record.trajectory_id)].append(record)
        except (TypeError, ValueError):
            _set_aside([record], "bad_trajectory_id", f"not a trajectory id: {record.trajectory_id!r}",
                       dead_letter, outcome)
    return groups


def _write_group(trajectory_id: int, calls: list[CallRecord], dead_letter: DeadLetter,
                 outcome: WriteOutcome) -> None:
    try:
        steps = [call.to_step_record() for call in calls]
        outcome.stored += len(steps_append(trajectory_id=trajectory_id, steps=steps))
        return
    except Exception as exc:
        if is_transient(exc):
            _drop_broken_connection()
            raise
        error = exc
    if isinstance(error, NotFound):
        _set_aside(calls, "trajectory_gone", str(error), dead_letter, outcome)
    elif len(calls) == 1:
        _set_aside(calls, type(error).__name__, str(error), dead_letter, outcome)
    else:
        # steps_append validates a whole batch before writing any of it: one bad record refuses them all.
        # Write them one by one, so only the bad one is set aside.
        for call in calls:
            _write_group(trajectory_id, [call], dead_letter, outcome)


def is_transient(error: BaseException) -> bool:
    """A database error a retry can cure (connection lost, server restarting, lock timeout, deadlock).

    Data, integrity and not-supported errors are about the record, not the database: retrying them
    fails the same way."""
    return isinstance(error, DatabaseError) and not isinstance(error, DataError | IntegrityError | NotSupportedError)


def _drop_broken_connection() -> None:
    # Inside the caller's transaction the connection is not ours to close; outside it, a broken one is
    # dropped so the retry reconnects instead of failing on "connection already closed" for ever.
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


def _set_aside(calls: list[CallRecord], reason: str, error: str, dead_letter: DeadLetter,
               outcome: WriteOutcome) -> None:
    for call in calls:
        dead_letter(call, reason, error)
    outcome.dead_lettered += len(calls)
    with _count_lock:
        dead_lettered[reason] += len(calls)
    log.error("set aside %d call record(s) of trajectory %s that can never be written (%s: %s); first call id %s",
              len(calls), calls[0].trajectory_id, reason, error[:300], calls[0].call_id)


# --- dead letters ---------------------------------------------------------------------------------------


def dead_letter_line(record: CallRecord, reason: str, error: str) -> dict:
    return {"reason": reason, "error": error, "at": datetime.now(UTC).isoformat(), "record": record.to_dict()}


def file_dead_letter(path: Path) -> DeadLetter:
    """Append each record, with why it was set aside, as a JSON line to `path` (fsync'd: a dead letter is
    the record's last copy). The records hold prompts and answers, so the file is private (0600)."""

    def write(record: CallRecord, reason: str, error: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(dead_letter_line(record, reason, error), ensure_ascii=False).encode() + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    return write


def stream_dead_letter(client: redis.Redis, *, stream: str) -> DeadLetter:
    """XADD each record to `<stream>:dead` (where the consumer also puts entries it cannot decode), with
    `reason` and `error` fields beside `record`. Capped (approximately) at DEAD_LETTER_STREAM_MAXLEN."""

    def write(record: CallRecord, reason: str, error: str) -> None:
        fields: dict[Any, Any] = {"record": record.to_json(), "reason": reason, "error": error[:2000]}
        client.xadd(f"{stream}:dead", fields, maxlen=DEAD_LETTER_STREAM_MAXLEN, approximate=True)

    return write
