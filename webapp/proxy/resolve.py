"""A small time-bounded cache in front of a token resolver, so the hot path does not look a rollout up
in the database on every call. A revoked token keeps working for at most `ttl_s`."""

from __future__ import annotations

import time

from webapp.proxy.app import Resolve, Target


def cached_resolver(
    resolve: Resolve, *, ttl_s: float = 5.0, miss_ttl_s: float = 1.0, max_entries: int = 10_000
) -> Resolve:
    """Wrap `resolve` with a per-token cache (unknown tokens are cached briefly too, so a client hammering
    with a bad token does not hammer the database)."""
    cache: dict[str, tuple[float, Target | None]] = {}

    async def cached(token: str) -> Target | None:
        now = time.monotonic()
        hit = cache.get(token)
        if hit is not None and hit[0] > now:
            return hit[1]
        target = await resolve(token)
        if len(cache) >= max_entries:
            cache.clear()  # crude, but bounded; a burst of misses costs one lookup each
        cache[token] = (now + (ttl_s if target is not None else miss_ttl_s), target)
        return target

    return cached
