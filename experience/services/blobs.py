"""Content-addressed blob storage: each distinct content stored once, keyed by sha256 of its raw bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import zstandard

from experience.models import Blob

# Below this size compression rarely pays for its CPU; above it, text compresses 3-10x.
COMPRESS_MIN_BYTES = 512
_compressor = zstandard.ZstdCompressor(level=3)
_decompressor = zstandard.ZstdDecompressor()


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _encode(content: bytes) -> tuple[str, bytes]:
    if len(content) >= COMPRESS_MIN_BYTES:
        packed = _compressor.compress(content)
        if len(packed) < len(content):
            return "zstd", packed
    return "raw", content


def blob_put_many(contents: Iterable[bytes]) -> list[str]:
    """Store each content once (idempotent, safe under concurrency) and return their hashes in order."""
    hashes: list[str] = []
    pending: dict[str, bytes] = {}
    for content in contents:
        digest = sha256_hex(content)
        hashes.append(digest)
        pending.setdefault(digest, content)
    if pending:
        existing = set(Blob.objects.filter(sha256__in=list(pending)).values_list("sha256", flat=True))
        new_rows = []
        for digest, content in pending.items():
            if digest in existing:
                continue
            encoding, data = _encode(content)
            new_rows.append(Blob(sha256=digest, size=len(content), encoding=encoding, data=data))
        # ignore_conflicts: a concurrent writer may store the same content between our read and write.
        Blob.objects.bulk_create(new_rows, ignore_conflicts=True, batch_size=500)
    return hashes


def blob_put(content: bytes) -> str:
    return blob_put_many([content])[0]


def _decode(blob: Blob) -> bytes:
    data = bytes(blob.data)
    return _decompressor.decompress(data) if blob.encoding == "zstd" else data


def blob_get_many(hashes: Iterable[str]) -> dict[str, bytes]:
    wanted = list(dict.fromkeys(hashes))
    return {blob.sha256: _decode(blob) for blob in Blob.objects.filter(sha256__in=wanted)}


def blob_get(digest: str) -> bytes:
    return blob_get_many([digest])[digest]
