"""What an uploaded file may make an importer do: how much an archive member may inflate, and how deep a JSON
document may nest. Both are attacks a few hundred kilobytes can carry (a zip bomb, `[[[[…]]]]`), and both must
end as an ImportFormatError naming the file, never as a process out of memory or a RecursionError.

Archive members are read through `read_member`, which counts the bytes decompression actually yields, chunk by
chunk, and stops at the first chunk over a limit: the sizes in a zip's headers are the file author's to write
and are not trusted (they are checked too, so an honest oversized member fails before any work). Only stored
and deflated members are read: deflate cannot inflate more than ~1032:1 per input byte, and its decompressor
honours an output bound per call, so one read never yields more than a chunk; bzip2 and lzma members (which
Inspect never writes) could inflate a single input chunk to gigabytes before the count sees it.

JSON is parsed through `loads_json`: CPython's parser raises RecursionError somewhere below ~1000 levels, and
the code that walks a parsed document afterwards (attachment resolution, `json.dumps` for the store) recurses
too, so documents deeper than MAX_JSON_DEPTH are refused outright. Agent logs nest a few dozen levels at most.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
MAX_MEMBER_BYTES = 64 * MIB  # one member, uncompressed: it is held whole while its JSON is parsed
MAX_ARCHIVE_BYTES = 512 * MIB  # all members read from one archive, uncompressed
MAX_RATIO = 100  # uncompressed : compressed, per member (JSON logs deflate 5-20x)
RATIO_FREE_BYTES = 1 * MIB  # small members may compress oddly well (a run of spaces): no ratio below this
MAX_JSON_DEPTH = 200
READ_CHUNK = 256 * 1024
READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}


class LimitBreached(ValueError):
    """An input goes past one of this module's limits; the message says which and by how much."""


@dataclass
class ArchiveBudget:
    """The limits for reading one archive, and the uncompressed bytes read from it so far."""

    archive_bytes: int  # the archive file's own size: no member can hold more compressed data than that
    max_member: int = MAX_MEMBER_BYTES
    max_total: int = MAX_ARCHIVE_BYTES
    max_ratio: int = MAX_RATIO
    used: int = 0


def check_member_header(info: zipfile.ZipInfo, budget: ArchiveBudget) -> None:
    """Refuse a member whose own header already says it is too big, encrypted or oddly compressed."""
    if info.flag_bits & 0x1:
        raise LimitBreached(f"{info.filename}: the member is encrypted")
    if info.compress_type not in READABLE_METHODS:
        raise LimitBreached(f"{info.filename}: compression method {info.compress_type} is not read "
                            f"(only {', '.join(READABLE_METHODS.values())})")
    if info.file_size > budget.max_member:
        raise LimitBreached(f"{info.filename}: declares {info.file_size} bytes uncompressed, over the limit of "
                            f"{budget.max_member} per member (zip bomb?)")


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: ArchiveBudget) -> bytes:
    """The member's bytes, read in chunks; raises LimitBreached as soon as the inflated size, the archive's
    total or the compression ratio goes over its limit, whatever the headers declared."""
    check_member_header(info, budget)
    compressed = max(1, min(info.compress_size, budget.archive_bytes))
    chunks: list[bytes] = []
    size = 0
    with archive.open(info) as stream:
        while chunk := stream.read(READ_CHUNK):
            size += len(chunk)
            _check_inflated(info.filename, size, compressed, budget)
            chunks.append(chunk)
    budget.used += size
    return b"".join(chunks)


def _check_inflated(name: str, size: int, compressed: int, budget: ArchiveBudget) -> None:
    if size > budget.max_member:
        raise LimitBreached(f"{name}: inflates past {budget.max_member} bytes, the limit per member (zip bomb?)")
    if budget.used + size > budget.max_total:
        raise LimitBreached(f"{name}: the archive inflates past {budget.max_total} bytes in all, the limit per "
                            f"archive (zip bomb?)")
    if size > RATIO_FREE_BYTES and size > compressed * budget.max_ratio:
        raise LimitBreached(f"{name}: inflates more than {budget.max_ratio}:1 ({compressed} bytes compressed "
                            f"gave {size} so far; zip bomb?)")


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """The content of a gzip stream, or LimitBreached once it inflates past `limit` bytes. Read in chunks (the
    decompressor honours the bound per call), so a gzip bomb stops at its first chunk over the limit; a tar
    read from the result cannot make tarfile inflate more (its GNU long-name and pax headers are read whole)."""
    content = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        while chunk := stream.read(READ_CHUNK):
            content += chunk
            if len(content) > limit:
                raise LimitBreached(f"inflates past {limit} bytes (a gzip bomb?)")
    return bytes(content)


# ---------------------------------------------------------------- JSON


class JsonTooDeep(LimitBreached):
    pass


def loads_json(data: bytes | str, *, strict: bool = True) -> Any:
    """json.loads that refuses documents nested deeper than MAX_JSON_DEPTH with JsonTooDeep (a ValueError,
    so callers that treat "not JSON" as ValueError keep doing so). Other faults raise as json.loads does.
    `strict=False` accepts raw control characters inside strings (json.loads' own flag)."""
    try:
        value = json.loads(data, strict=strict)
    except RecursionError:
        raise JsonTooDeep(_too_deep()) from None
    if nesting_exceeds(value, MAX_JSON_DEPTH):
        raise JsonTooDeep(_too_deep())
    return value


def _too_deep() -> str:
    return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether objects and lists in `value` nest deeper than `limit` (a bare scalar is depth 0). Iterative:
    the point is to measure documents too deep to recurse over."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False
