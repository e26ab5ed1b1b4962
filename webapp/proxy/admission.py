"""How many model calls the proxy admitted for a rollout attempt, exactly, and a gate that closes it.

A rollout runner whose external harness has exited must know when all of the harness's calls are in the
store. The harness does not say how many it made, so the proxy counts them: each call, once its token
checked out and before anything is forwarded, is admitted here, and every admitted call ends in exactly one
record (the proxy records in a `finally`, errors and client disconnects included). The runner then closes
the gate and reads the count in one step (one Lua script: Redis runs it atomically), so no call can be
admitted after the count was read: a process the harness left behind in the sandbox gets 401 from then on,
and is not recorded. The runner waits until the store holds that many distinct calls.

Admitted calls are counted by call id (a set), because the store keeps one step per call id: a harness that
sends the same call id twice is stored once and counted once.

Only on the full stack (REDIS_URL). While Redis cannot be reached a call goes ahead uncounted (the proxy
spools its record, and the harness never notices the outage); its runner, finding more calls stored than
counted, falls back to waiting until the count of stored calls stops moving (workers/rollout_runner.py), which
is exact only as far as that wait is long enough.
"""

from __future__ import annotations

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from webapp.rollouts.models import rollout_token_hash

# Longer than any rollout's remaining run: the keys only have to outlive the attempt (its token is refused by
# the database once the rollout is no longer running); each admission refreshes the count's. Closing the gate
# deletes the count (read once); an attempt whose gate is never closed (the built-in harness counts its own
# calls) leaves its count to expire.
KEY_TTL_S = 24 * 3600

_ADMIT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
_CLOSE = """
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
local admitted = redis.call('SCARD', KEYS[1])
redis.call('DEL', KEYS[1])
return admitted
"""


def _keys(prefix: str, token: str) -> list[str]:
    # By the token's hash: a new attempt has a new token, so a closed gate never refuses its successor.
    token_hash = rollout_token_hash(token)
    return [f"{prefix}:admitted:{token_hash}", f"{prefix}:closed:{token_hash}"]


class RedisAdmissions:
    """The proxy's side: `await admit(token, call_id)` -> False once the gate is closed. Raises
    redis.RedisError when Redis cannot answer."""

    def __init__(self, url: str, *, prefix: str) -> None:
        # Short timeouts: while Redis is unreachable each call waits this long before it goes ahead uncounted.
        self._client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2.0,
                                                    retry=Retry(NoBackoff(), 1))
        self._script = self._client.register_script(_ADMIT)
        self._prefix = prefix

    async def admit(self, token: str, call_id: str) -> bool:
        return bool(await self._script(keys=_keys(self._prefix, token), args=[call_id, KEY_TTL_S]))

    async def aclose(self, app: object = None) -> None:
        await self._client.aclose()


def close_and_count(client: redis.Redis, token: str, *, prefix: str) -> int:
    """The runner's side: close the attempt's gate and return how many distinct calls it admitted."""
    return int(client.register_script(_CLOSE)(keys=_keys(prefix, token), args=[KEY_TTL_S]))
