"""Rollout tokens to proxy targets, exactly: a call is forwarded (and recorded) only if, after it arrived,
its token was seen to belong to a running rollout.

Nothing is cached but the endpoint keys. Every call's token is looked up in the database before anything
is forwarded, so a rollout that finished, was cancelled or reaped, or whose token a new attempt replaced,
gets 401 on its very next call and no upstream call is made for it (its endpoint's key never leaves).
The database holds tokens as SHA-256 hashes (webapp/rollouts/models.py): the lookup hashes what it is sent.

What keeps the check cheap:
- coalescing: the checks waiting share one indexed query (`token IN (...)`, status running). A check
  joins the next query, never one already running (that query's snapshot may predate the call), so
  under load each call costs a fraction of a query;
- no thread hop on Postgres: the query runs on an async psycopg connection in the proxy's own event
  loop, kept open. Handing each check to a thread and back cost more than the query on a busy machine
  (every hand-off waits for the GIL and the scheduler). Other databases (SQLite, embedded) are queried
  on one dedicated thread that keeps its Django connection;
- prepared statements on Postgres: planning the join cost about four times running it. A round's tokens
  are padded to a power of two (at most MAX_TOKENS_PER_QUERY a query), so a handful of statements serve
  every round, each prepared once per connection.
Why not cache a token's answer and skip the query: an attempt also ends where only the database hears of
it (a job cancelled, a rollout reaped, requeued or given a new attempt's token), and nothing cheaper than a
round trip to the database could tell the proxy so before the next call; the prepared query is about that
round trip. What is kept is each resolved token's step budget (`known_budget`), so the proxy can count the
token's next call in Redis while the database checks it, the two round trips side by side.
The upstream API key is cached per secret reference for KEY_CACHE_S, as reading it may mean reading a file;
the reference is checked against the allow-list each time it is read (webapp/rollouts/endpoints.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cache
from typing import Any, Protocol

import psycopg
from django.db import InterfaceError, OperationalError, connection, models

from webapp.proxy.app import Target
from webapp.rollouts.endpoints import key_resolve
from webapp.rollouts.models import ModelEndpoint, Rollout, RolloutJob, rollout_token_hash

log = logging.getLogger("trove.proxy")

KEY_CACHE_S = 60.0
QUERY_TIMEOUT_S = 10.0  # past this the calls waiting get 503 rather than hang with a stuck database
CONNECT_TIMEOUT_S = 5
KNOWN_TOKENS = 4096  # far more than the attempts one proxy serves at once
MAX_TOKENS_PER_QUERY = 512  # a power of two, within SQLite's oldest parameter limit (999)
_Answer = Target | None | Exception
# token hash, rollout id, trajectory id, the job's endpoint: base URL, key reference, private network
# allowed, name, protocol; the job's model name; the endpoint's token capture and policy version source; the
# job's harness and max steps
Row = tuple[str, int, int, str, str, bool, str, str, str, str, str, str, int]


class Lookup(Protocol):
    async def rows(self, tokens: list[str]) -> list[Row]:
        """The running rollouts (with a trajectory) whose token hash is among `tokens`, with their job's
        endpoint and model name. Raises when the database cannot say."""

    async def close(self) -> None: ...


class TokenResolver:
    """`resolve(token)` (or `await resolver(token)`) -> where the token's calls go, looked up now; None for
    a token that is not a running rollout's. Raises when the database cannot answer (the proxy answers 503).

    One instance per proxy app (it lives in the app's event loop); `aclose` on the app's cleanup releases
    its connection. `lookup` defaults to `default_lookup()`.
    """

    def __init__(
        self,
        *,
        lookup: Lookup | None = None,
        key_cache_s: float = KEY_CACHE_S,
        query_timeout_s: float = QUERY_TIMEOUT_S,
    ) -> None:
        self._lookup = lookup or default_lookup()
        self._keys = _KeyCache(ttl_s=key_cache_s)
        self._query_timeout_s = query_timeout_s
        self._waiting: dict[str, list[asyncio.Future[_Answer]]] = {}
        self._rounds: asyncio.Task[None] | None = None
        self._budgets: OrderedDict[str, int] = OrderedDict()
        self.queries = 0  # how many lookups were made (a round of coalesced calls is one)

    async def resolve(self, token: str) -> Target | None:
        return await self._looked_up(token)

    __call__ = resolve

    def known_budget(self, token: str) -> int | None:
        """The step budget `token` had when it last resolved here; None if it has not, or was refused since.
        A hint (the proxy starts admitting a known token's call while the token is checked), never a grant:
        every call's token is still looked up. Only tokens that resolved are kept, at most KNOWN_TOKENS."""
        return self._budgets.get(token)

    def _remember(self, token: str, answer: _Answer) -> None:
        if isinstance(answer, Target):
            self._budgets[token] = answer.max_calls
            self._budgets.move_to_end(token)
            if len(self._budgets) > KNOWN_TOKENS:
                self._budgets.popitem(last=False)
        elif answer is None:
            self._budgets.pop(token, None)

    async def aclose(self, app: Any = None) -> None:
        """Release the lookup's database connection (an aiohttp on_cleanup)."""
        await self._lookup.close()

    async def _looked_up(self, token: str) -> Target | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Answer] = loop.create_future()
        self._waiting.setdefault(token, []).append(future)
        if self._rounds is None:
            self._rounds = loop.create_task(self._run_rounds())
        answer = await future
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def _run_rounds(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                answers = await self._answers(list(batch))
                for token, futures in batch.items():
                    answer = answers.get(token)
                    self._remember(token, answer)
                    for future in futures:
                        if not future.done():  # its caller may have gone (client disconnected)
                            future.set_result(answer)
        finally:
            self._rounds = None

    async def _answers(self, tokens: list[str]) -> dict[str, _Answer]:
        self.queries += 1
        by_hash = {rollout_token_hash(token): token for token in tokens}
        try:
            rows = await asyncio.wait_for(self._rows(list(by_hash)), self._query_timeout_s)
        except Exception as exc:  # every waiting call learns the database could not answer
            log.warning("rollout token lookup failed: %r", exc)
            return {token: exc for token in tokens}
        return {by_hash[row[0]]: self._target(*row) for row in rows}

    async def _rows(self, hashes: list[str]) -> list[Row]:
        rows: list[Row] = []
        for shape in _query_shapes(hashes):
            rows.extend(await self._lookup.rows(shape))
        return rows

    def _target(self, token_hash: str, rollout_id: int, trajectory_id: int, base_url: str, key_ref: str,
                allow_private_network: bool, endpoint: str, protocol: str, model_name: str, token_capture: str = "off",
                policy_version_from: str = "", harness: str = "builtin", max_steps: int = 0) -> Target:
        # The job's model is forced on every call: a harness sends whatever model its config or its own
        # defaults name (Claude Code asks for a small model for side tasks), and the job pins one.
        target = Target(rollout_id=str(rollout_id), trajectory_id=str(trajectory_id), upstream_base_url=base_url,
                        allow_private_network=bool(allow_private_network), endpoint=endpoint, protocol=protocol,
                        model_override=model_name or None, token_capture=token_capture or "off",
                        policy_version_from=policy_version_from or "",
                        max_calls=_max_calls(harness, max_steps))
        try:
            key = self._keys.get(key_ref)
        except Exception as exc:  # one endpoint's unreadable key must not fail other jobs' calls
            # The error names the reference and why, never a key (a reference is not a secret).
            message = getattr(exc, "message", None) or repr(exc)
            log.error("rollout %s: endpoint %s: cannot use its key: %s", rollout_id, endpoint, message)
            return replace(target, refusal=f"endpoint {endpoint!r} cannot be used: {message}")
        return replace(target, upstream_api_key=key)


def _query_shapes(hashes: list[str]) -> list[list[str]]:
    """A round's token hashes as the lists its queries take: at most MAX_TOKENS_PER_QUERY each (a flood of
    tokens must not make one statement past the database's parameter limit), each padded with its last hash
    to a power of two, so every query is one of a few statements, each prepared once per connection, however
    the calls arrive. A repeated hash matches the same row once."""
    shapes = []
    for start in range(0, len(hashes), MAX_TOKENS_PER_QUERY):
        chunk = hashes[start:start + MAX_TOKENS_PER_QUERY]
        size = 1 << (len(chunk) - 1).bit_length()
        shapes.append(chunk + [chunk[-1]] * (size - len(chunk)))
    return shapes


def _max_calls(harness: str, max_steps: int) -> int:
    """The job's step budget as the proxy holds it: for every external harness (a preset or a command), whether
    or not it takes a turn limit of its own. Not for the built-in harness: it counts its own turns, and the
    retries of a failed call it makes would count here too."""
    return 0 if harness == "builtin" else int(max_steps or 0)


def default_lookup() -> Lookup:
    return PostgresLookup() if connection.vendor == "postgresql" else ThreadLookup()


class PostgresLookup:
    """Queries on one async psycopg connection in the caller's event loop, opened on first use, kept
    open, and replaced once if the database dropped it (a restart, an idle timeout)."""

    def __init__(self) -> None:
        self._params = _psycopg_params(connection.settings_dict)
        self._connection: psycopg.AsyncConnection[Any] | None = None

    async def rows(self, tokens: list[str]) -> list[Row]:
        for attempt in (1, 2):
            try:
                return await self._query(tokens)
            # A stale prepared statement (a migration changed the tables it reads) fails once, as a dropped
            # connection does: a new connection prepares it afresh.
            except (psycopg.OperationalError, psycopg.errors.FeatureNotSupported):
                await self.close()
                if attempt == 2:
                    raise
            except BaseException:  # cancelled (timed out) mid-query: the connection's state is unknown
                await self.close()
                raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._connection is not None:
            held, self._connection = self._connection, None
            await held.close()

    async def _query(self, tokens: list[str]) -> list[Row]:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(**self._params, autocommit=True)
        # Prepared: planning the three-table join cost several times executing it (each count of tokens
        # a round carries is its own statement, prepared on its first use on this connection).
        cursor = await self._connection.execute(_running_rollouts_sql(len(tokens)),
                                                [Rollout.Status.RUNNING, *tokens], prepare=True)
        return await cursor.fetchall()


def _psycopg_params(settings_dict: dict[str, Any]) -> dict[str, Any]:
    # Django's own connection parameters carry its cursor classes and adapters: build plain libpq ones.
    django_only = {"isolation_level", "server_side_binding", "assume_role", "pool"}
    params = {"dbname": settings_dict["NAME"], "user": settings_dict["USER"], "password": settings_dict["PASSWORD"],
              "host": settings_dict["HOST"], "port": settings_dict["PORT"], "connect_timeout": CONNECT_TIMEOUT_S}
    params.update({key: value for key, value in settings_dict.get("OPTIONS", {}).items() if key not in django_only})
    return {key: value for key, value in params.items() if value not in ("", None)}


class ThreadLookup:
    """Queries on one dedicated thread that keeps its Django connection (for databases without an async
    driver here: SQLite in the embedded default)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trove-proxy-tokens")

    async def rows(self, tokens: list[str]) -> list[Row]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, _rows_with_reconnect, tokens)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, _close_connection)
        self._executor.shutdown(wait=False)


def _close_connection() -> None:
    connection.close()  # `connection` is per thread: this must run on the thread that owns it


def _rows_with_reconnect(tokens: list[str]) -> list[Row]:
    # The lookup thread keeps its connection between queries. One the database dropped fails the first
    # query after; reconnect once before giving up.
    for attempt in (1, 2):
        try:
            with connection.cursor() as cursor:
                cursor.execute(_running_rollouts_sql(len(tokens)), [Rollout.Status.RUNNING, *tokens])
                return cursor.fetchall()
        except (OperationalError, InterfaceError):
            connection.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@cache
def _running_rollouts_sql(count: int) -> str:
    # Plain SQL: on this hot path the ORM's query building cost several times the query itself.
    q = connection.ops.quote_name

    def r(name: str) -> str:
        return f"r.{q(_column(Rollout, name))}"

    def j(name: str) -> str:
        return f"j.{q(_column(RolloutJob, name))}"

    def e(name: str) -> str:
        return f"e.{q(_column(ModelEndpoint, name))}"

    return (f"SELECT {r('token')}, {r('id')}, {r('trajectory')}, {e('base_url')}, {e('key_ref')}, "
            f"{e('allow_private_network')}, {e('name')}, {e('protocol')}, {j('model_name')}, "
            f"{e('token_capture')}, {e('policy_version_from')}, {j('harness')}, {j('max_steps')} "
            f"FROM {q(Rollout._meta.db_table)} r JOIN {q(RolloutJob._meta.db_table)} j ON {j('id')} = {r('job')} "
            f"JOIN {q(ModelEndpoint._meta.db_table)} e ON {e('id')} = {j('endpoint')} "
            f"WHERE {r('status')} = %s AND {r('trajectory')} IS NOT NULL "
            f"AND {r('token')} IN ({', '.join(['%s'] * count)})")


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column
    return field.column


class _KeyCache:
    """Secret reference -> key, kept `ttl_s` (a rotated key is picked up within that)."""

    def __init__(self, *, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._keys: dict[str, tuple[float, str]] = {}

    def get(self, reference: str) -> str:
        now = time.monotonic()
        hit = self._keys.get(reference)
        if hit is not None and hit[0] > now:
            return hit[1]
        key = key_resolve(reference)

        self._keys[reference] = (now + self._ttl_s, key)
        return key
