"""Content-addressed blob storage: each distinct content stored once, keyed by sha256 of its raw bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from django.db import connection, transaction
from django.utils import timezone

from experience import zstd
from experience.models import Blob
from experience.services.bulk import copy_ignoring_conflicts, is_postgres

# Below this size compression rarely pays for its CPU; above it, text compresses 3-10x.
COMPRESS_MIN_BYTES = 512
_LOOKUP_CHUNK = 5000  # digests per "which of these exist" query (SQLite caps bound parameters)
BLOB_ZSTD_LEVEL = 1
COLUMNS = ("sha256", "size", "encoding", "data", "created_at")
COLUMN_TYPES = ("varchar", "int8", "varchar", "bytea", "timestamptz")  # for a binary COPY of COLUMNS


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _encode(content: bytes) -> tuple[str, bytes]:
    if len(content) >= COMPRESS_MIN_BYTES:
        packed = zstd.compress(content, level=BLOB_ZSTD_LEVEL)
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
    blobs_store(pending)
    return hashes


def blobs_store(contents: Mapping[str, bytes]) -> int:
    """Store the contents (keyed by their sha256) that are not stored yet. Returns how many were new.

    Idempotent and safe under concurrency: a content a concurrent writer stores first is kept once.
    """
    missing = _missing(contents)
    if not missing:
        return 0
    with transaction.atomic():
        if is_postgres():
            now = timezone.now()
            ordered = sorted(missing)  # one order for every writer, so two racing on shared content cannot deadlock
            copy_ignoring_conflicts(
                "experience_blob", COLUMNS, lambda: ((d, len(contents[d]), *_encode(contents[d]), now) for d in ordered),
                conflict="sha256", types=COLUMN_TYPES,
            )
        else:
            Blob.objects.bulk_create(
                [_row(d, contents[d]) for d in sorted(missing)], ignore_conflicts=True, batch_size=500
            )
    return len(missing)


def _missing(contents: Mapping[str, bytes]) -> list[str]:
    digests = list(contents)
    if is_postgres():
        # One text parameter split by Postgres: an IN list of thousands of parameters is slow to build and
        # send, and even an array parameter costs psycopg a Python call per digest to dump.
        with connection.cursor() as cursor:
            cursor.execute("SELECT sha256 FROM experience_blob WHERE sha256 = ANY(string_to_array(%s, ','))",
                           [",".join(digests)])
            existing = {row[0] for row in cursor.fetchall()}
    else:
        existing = set()
        for start in range(0, len(digests), _LOOKUP_CHUNK):
            chunk = digests[start : start + _LOOKUP_CHUNK]
            existing.update(Blob.objects.filter(sha256__in=chunk).values_list("sha256", flat=True))
    return [d for d in digests if d not in existing]


def _row(digest: str, content: bytes) -> Blob:
    encoding, data = _encode(content)
    return Blob(sha256=digest, size=len(content), encoding=encoding, data=data)


def blob_put(content: bytes) -> str:
    return blob_put_many([content])[0]


def _decode(blob: Blob) -> bytes:
    data = bytes(blob.data)
    return zstd.decompress(data) if blob.encoding == "zstd" else data


def blob_get_many(hashes: Iterable[str]) -> dict[str, bytes]:
    wanted = list(dict.fromkeys(hashes))
    found: dict[str, bytes] = {}
    for start in range(0, len(wanted), _LOOKUP_CHUNK):
        chunk = wanted[start : start + _LOOKUP_CHUNK]
        found.update((blob.sha256, _decode(blob)) for blob in Blob.objects.filter(sha256__in=chunk))
    return found


def blob_get(digest: str) -> bytes:
    return blob_get_many([digest])[digest]
