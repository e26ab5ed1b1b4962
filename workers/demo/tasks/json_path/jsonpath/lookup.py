"""Look up values in parsed JSON with paths like  a.b[0]["key.with.dots"][-1] ."""

import re
from typing import Any

_TOKEN = re.compile(
    r"(?P<name>[A-Za-z_][A-Za-z0-9_-]*)"  # a bare key
    r"|\[(?P<index>-?\d+)\]"  # a list index, negative counts from the end
    r'|\["(?P<quoted>(?:[^"\\]|\\.)*)"\]'  # a quoted key, backslash escapes
)
_ESCAPE = re.compile(r"\\(.)")
_MISSING = object()


def parse_path(path: str) -> list[str | int]:
    """'a.b[0]["x.y"]' -> ['a', 'b', 0, 'x.y']. Raises ValueError on anything it cannot read."""
    parts: list[str | int] = []
    pos = 0
    while pos < len(path):
        # A dot separates two parts; it may not lead, trail or repeat.
        if path[pos] == "." and parts and pos + 1 < len(path):
            pos += 1
        match = _TOKEN.match(path, pos)
        if match is None:
            raise ValueError(f"cannot read path {path!r} at position {pos}")
        if match.group("name") is not None:
            parts.append(match.group("name"))
        elif match.group("index") is not None:
            parts.append(int(match.group("index")))
        else:
            parts.append(_ESCAPE.sub(r"\1", match.group("quoted")))
        pos = match.end()
    if not parts:
        raise ValueError("empty path")
    return parts


def get(document: Any, path: str, default: Any = None) -> Any:
    node = document
    for part in parse_path(path):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return default
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def exists(document: Any, path: str) -> bool:
    return get(document, path, _MISSING) is not _MISSING
