"""JSON on the proxy's hot path: orjson, with the standard library for what orjson refuses.

Every call is parsed (request, response, stream chunks) and every record encoded; with the stdlib `json`
that was a large share of the proxy's CPU per call. orjson is several times faster, but stricter: it
rejects NaN / Infinity literals and integers beyond 64 bits, which `json` accepts and an upstream or a
client may send. Those fall back to `json`, so what parses (and how) is what it was before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; raises ValueError (as `json.loads` does) when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)  # NaN, Infinity, huge integers; raises ValueError on real garbage


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON. datetimes are written as isoformat (orjson's RFC 3339 form)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits, a non-string key: what `json` writes, it keeps writing
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_isoformat).encode()


def _isoformat(value: Any) -> str:
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
