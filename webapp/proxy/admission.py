"""How many model calls the proxy admitted for a rollout attempt, exactly, a gate that closes it, and the
job's step budget held for every harness.

A rollout runner whose external harness has exited must know when all of the harness's calls are in the
store. The harness does not say how many it made, so the proxy counts them: each call, once its token
checked out and before anything is forwarded, is admitted here, and every admitted call ends in exactly one
record (the proxy records in a `finally`, errors and client disconnects included). The runner then closes
the gate and reads the count in one step (one Lua script: Redis runs it atomically), so no call can be
admitted after the count was read: a process the harness left behind in the sandbox gets 401 from then on,
and is not recorded. The runner waits until the store holds that many distinct calls.

Admitted calls are counted by call id (a set), because the store keeps one step per call id: a harness that
sends the same call id twice is stored once and counted once.

The step budget (`max_calls`, the job's max_steps for an external harness) is held in the same script, so it
costs no extra round trip and concurrent calls cannot race past it: it counts every call forwarded (a
repeated call id too: each one goes upstream), and refuses the budget's next call and every later one, which
the proxy answers 403 and does not record. The refusals are counted; closing the gate reads them too, so the
runner can say the budget ended the run.

The full stack counts in Redis (REDIS_URL). While Redis cannot be reached a call goes ahead uncounted (the
proxy spools its record, and the harness never notices the outage; nor is the budget held meanwhile); its
runner, finding more calls stored than counted, falls back to waiting until the count of stored calls stops
moving (workers/rollout_runner.py), which is exact only as far as that wait is long enough.

The embedded default (no Redis) counts in the proxy's process (`LocalAdmissions`), under the same rules. Its
runner, in the same process, closes the gate there; a runner in a process with no proxy learns nothing from
it (the count is unknown: it waits for quiet), and the proxy process still holds the budget. Several proxy
processes without Redis each hold it on their own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from webapp.proxy.app import Admission
from webapp.rollouts.models import rollout_token_hash

# Longer than any rollout's remaining run: the keys only have to outlive the attempt (its token is refused by
# the database once the rollout is no longer running); each admission refreshes the count's. Closing the gate
# deletes the count (read once); an attempt whose gate is never closed (the built-in harness counts its own
# calls) leaves its count to expire.
KEY_TTL_S = 24 * 3600

# KEYS: the admitted call ids (a set), the closed flag, the budget's counts (a hash: forwarded, refused).
# ARGV: the call id, the keys' TTL, the attempt's max calls (0: none). Returns 1 admitted, 0 closed, 2 spent.
_ADMIT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local budget = tonumber(ARGV[3])
if budget > 0 then
  if tonumber(redis.call('HGET', KEYS[3], 'forwarded') or '0') >= budget then
    redis.call('HINCRBY', KEYS[3], 'refused', 1)
    redis.call('EXPIRE', KEYS[3], ARGV[2])
    return 2
  end
  redis.call('HINCRBY', KEYS[3], 'forwarded', 1)
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
# Takes back a call admitted while its token was being checked, found ended (see `unadmit`). ARGV: the call id,
# the attempt's max calls. Returns 1 taken back, 0 too late (the gate closed: the count was read).
_UNADMIT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SREM', KEYS[1], ARGV[1])
if tonumber(ARGV[2]) > 0 then redis.call('HINCRBY', KEYS[3], 'forwarded', -1) end
return 1
"""
# Returns {admitted distinct call ids, refused calls}; both are read once.
_CLOSE = """
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
local admitted = redis.call('SCARD', KEYS[1])
local refused = tonumber(redis.call('HGET', KEYS[3], 'refused') or '0')
redis.call('DEL', KEYS[1], KEYS[3])
return {admitted, refused}
"""
_ADMISSIONS = {1: Admission.ADMITTED, 0: Admission.GATE_CLOSED, 2: Admission.BUDGET_SPENT}


@dataclass(frozen=True)
class GateCount:
    """What closing an attempt's gate tells its runner: the distinct calls admitted (each ends in a record),
    and how many calls the step budget refused (none of them recorded)."""

    admitted: int
    refused: int = 0


def _keys(prefix: str, token: str) -> list[str]:
    # By the token's hash: a new attempt has a new token, so a closed gate never refuses its successor.
    token_hash = rollout_token_hash(token)
    # The budget's counts sit under `admitted:` too: whoever sweeps an attempt's admission keys finds them.
    admitted = f"{prefix}:admitted:{token_hash}"
    return [admitted, f"{prefix}:closed:{token_hash}", f"{admitted}:budget"]


class RedisAdmissions:
    """The proxy's side: `await admit(token, call_id, max_calls)` -> an Admission. Raises redis.RedisError
    when Redis cannot answer."""

    def __init__(self, url: str, *, prefix: str) -> None:
        # Short timeouts: while Redis is unreachable each call waits this long before it goes ahead uncounted.
        self._client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2.0,
                                                    retry=Retry(NoBackoff(), 1))
        self._script = self._client.register_script(_ADMIT)
        self._unadmit = self._client.register_script(_UNADMIT)
        self._prefix = prefix

    async def admit(self, token: str, call_id: str, max_calls: int = 0) -> Admission:
        answer = await self._script(keys=_keys(self._prefix, token), args=[call_id, KEY_TTL_S, max_calls])
        return _ADMISSIONS[int(answer)]

    async def unadmit(self, token: str, call_id: str, max_calls: int = 0) -> bool:
        """Take back an admitted call that will not be forwarded nor recorded: its token, checked while the
        call was being admitted, turned out to be no running rollout's (the proxy admits a known token's call
        and checks the token at once, webapp/proxy/app.py). False when the gate had closed meanwhile: that
        count was read with the call in it (the attempt had ended anyway; its runner waits for quiet).
        A call id the attempt had sent before is taken out too: the count then falls short, which its runner
        also meets by waiting for quiet."""
        return bool(await self._unadmit(keys=_keys(self._prefix, token), args=[call_id, max_calls]))

    async def aclose(self, app: object = None) -> None:
        await self._client.aclose()


def close_and_count(client: redis.Redis, token: str, *, prefix: str) -> GateCount:
    """The runner's side: close the attempt's gate; what it admitted and refused."""
    admitted, refused = client.register_script(_CLOSE)(keys=_keys(prefix, token), args=[KEY_TTL_S])
    return GateCount(admitted=int(admitted), refused=int(refused))


# --- the embedded default: the same rules in the proxy's process ------------------------------------------

SWEEP_EVERY_S = 600.0  # how often admitting looks for attempts untouched for KEY_TTL_S (the expiry Redis does)


@dataclass
class _Attempt:
    call_ids: set[str] = field(default_factory=set)
    forwarded: int = 0
    refused: int = 0
    closed: bool = False
    touched: float = field(default_factory=time.monotonic)


class LocalAdmissions:
    """Admissions kept in this process, for the embedded default (no Redis). The proxy admits on its event
    loop's thread, a runner closes gates on its own: one lock, held for a few dictionary operations.

    `close_and_count` returns None unless a proxy app in this process admits here (`serving`): a runner
    whose proxy runs elsewhere cannot tell an attempt that made no call from one it never saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[str, _Attempt] = {}
        self._serving = 0
        self._swept = time.monotonic()

    async def admit(self, token: str, call_id: str, max_calls: int = 0) -> Admission:
        with self._lock:
            self._sweep()
            attempt = self._attempts.setdefault(rollout_token_hash(token), _Attempt())
            attempt.touched = time.monotonic()
            if attempt.closed:
                return Admission.GATE_CLOSED
            if max_calls and attempt.forwarded >= max_calls:
                attempt.refused += 1
                return Admission.BUDGET_SPENT
            attempt.forwarded += 1
            attempt.call_ids.add(call_id)
            return Admission.ADMITTED

    def close_and_count(self, token: str) -> GateCount | None:
        with self._lock:
            if not self._serving:
                return None
            # A closed attempt keeps only its flag (the call ids and counts are read once, as in Redis).
            attempt = self._attempts.pop(rollout_token_hash(token), _Attempt())
            self._attempts[rollout_token_hash(token)] = _Attempt(closed=True)
            return GateCount(admitted=len(attempt.call_ids), refused=attempt.refused)

    async def serve(self, app: Any = None) -> None:
        """An aiohttp on_startup: a proxy app in this process admits here."""
        with self._lock:
            self._serving += 1

    async def unserve(self, app: Any = None) -> None:
        with self._lock:
            self._serving -= 1

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        stale = [key for key, attempt in self._attempts.items() if now - attempt.touched > KEY_TTL_S]
        for key in stale:
            del self._attempts[key]


# The embedded default's one instance: its proxy (a thread of the web process) and its runners (the in-process
# Celery worker) share it.
local_admissions = LocalAdmissions()
