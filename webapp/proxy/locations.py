"""Where this Trove's proxy records travel: the Redis stream, the spool directory, the dead letters.

All are named after the database the records belong to (unless TROVE_PROXY_STREAM is set), so two Troves,
or two test runs, sharing one Redis or one var directory never ingest each other's calls: a record only
means something to the database its trajectory is in. Looked up at call time, not import time, because the
test runner renames the database after settings are loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.db import connections

STREAM_PREFIX = "trove:proxy:calls"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "default"


def proxy_stream() -> str:
    """The Redis stream the proxy's records go through on the full stack."""
    if settings.TROVE_PROXY_STREAM:
        return settings.TROVE_PROXY_STREAM
    database = Path(str(connections["default"].settings_dict["NAME"])).name  # an SQLite path: its file name
    return f"{STREAM_PREFIX}:{slug(database)}"


def proxy_spool_root() -> Path:
    return Path(settings.TROVE_PROXY_SPOOL_DIR)


def proxy_spool_dir() -> Path:
    """This Trove's spool directory. Shared by its proxy processes on a host: each writes segments of its
    own, and any of them re-sends the segments of one that died (see spool.py)."""
    return proxy_spool_root() / slug(proxy_stream())


def dead_letter_path() -> Path:
    """The JSONL file of records the in-process writer could never store (the full stack's go to the
    `<stream>:dead` Redis stream instead)."""
    return proxy_spool_root() / "dead-letter" / f"{slug(proxy_stream())}.jsonl"
