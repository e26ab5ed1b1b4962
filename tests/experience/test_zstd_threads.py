"""zstd from several threads at once: each thread has its own (de)compressor, and what comes back is exact."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from experience import zstd
from experience.services.blobs import _encode


def test_each_thread_gets_its_own_decompressor_and_compressor():
    seen = []

    def grab():
        zstd.decompress(zstd.compress(b"x" * 1000, level=1))
        seen.append((zstd._local.decompressor, zstd._local.compressors[1]))  # kept alive: ids stay unique

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    grab()  # this thread's too, and a second call in one thread reuses its own
    assert len({id(decompressor) for decompressor, _ in seen}) == 5
    assert len({id(compressor) for _, compressor in seen}) == 5
    grab()
    assert seen[-1][0] is seen[-2][0] and seen[-1][1] is seen[-2][1]


def test_many_threads_compressing_and_decompressing_together_get_their_own_bytes_back():
    payloads = [os.urandom(64) * (200 + i) for i in range(64)]

    def round_trip(payload: bytes) -> bool:
        encoding, packed = _encode(payload)
        assert encoding == "zstd"
        return all(zstd.decompress(packed) == payload for _ in range(20))

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(round_trip, payloads * 4))
