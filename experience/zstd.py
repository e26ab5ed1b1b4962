"""zstd compression that is safe to call from several threads at once.

python-zstandard's compressor and decompressor objects are not thread safe: two threads using one object at
the same time corrupt each other's state (a runner's threads reading blobs together failed with "Data
corruption detected"). Each thread gets its own objects, made once and reused, so the hot paths keep the
cost of one object per thread rather than one per call."""

from __future__ import annotations

import threading

import zstandard

_local = threading.local()


def compress(data: bytes, *, level: int) -> bytes:
    compressors = getattr(_local, "compressors", None)
    if compressors is None:
        compressors = _local.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(data)


def decompress(data: bytes) -> bytes:
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor.decompress(data)
