"""Semantic version parsing and ordering."""

import re
from functools import total_ordering

_PATTERN = re.compile(
    r"^(\d+)\.(\d+)\.(\d+)"  # major.minor.patch
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"  # pre-release identifiers
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"  # build metadata, ignored for ordering
)


@total_ordering
class Version:
    def __init__(self, text: str) -> None:
        match = _PATTERN.match(text.strip())
        if match is None:
            raise ValueError(f"not a semantic version: {text!r}")
        self.text = text.strip()
        self.major, self.minor, self.patch = (int(g) for g in match.group(1, 2, 3))
        self.prerelease = tuple(match.group(4).split(".")) if match.group(4) else ()

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, self.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: "Version") -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as a sorts before, with or after b."""
    va, vb = Version(a), Version(b)
    return (va > vb) - (va < vb)


def max_version(versions: list[str]) -> str:
    return max(versions, key=Version)
