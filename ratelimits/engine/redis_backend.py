"""The production engine: every limit of a request decided in one EVALSHA on Redis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import redis

from ratelimits.engine.assemble import FIELDS, assemble
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.keys import (
    OFFENDER_CHARS,
    TOKEN_ALGORITHMS,
    US,
    base_key,
    burst_of,
    new_token,
    offenders_key,
    period_us,
    stats_key,
    to_us,
)
from ratelimits.engine.types import Decision, Limit

#: One file per algorithm (see lua/prelude.lua for how they are joined).
ALGORITHM_FILES = (
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "leaky_bucket",
    "gcra",
    "concurrency",
)

#: Errors that mean "the store is out of reach", as opposed to a bug in what we sent.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.BusyLoadingError,
)


def _dispatcher(name: str, params: str, bodies: dict[str, str]) -> str:
    lines = [f"local function {name}(algorithm, {params})"]
    for i, (algorithm, body) in enumerate(bodies.items()):
        lines.append(f"  {'if' if i == 0 else 'elseif'} algorithm == '{algorithm}' then")
        lines += [f"    {line}" if line else "" for line in body.strip("\n").split("\n")]
    lines += ["  else", "    error('unknown algorithm ' .. tostring(algorithm))", "  end", "end"]
    return "\n".join(lines)


@lru_cache(maxsize=1)
def batch_source() -> str:
    """The batch script: the prelude, the check and commit dispatchers, the entry point."""
    lua = resources.files("ratelimits.engine") / "lua"
    checks, commits = {}, {}
    for algorithm in ALGORITHM_FILES:
        text = (lua / f"{algorithm}.lua").read_text("utf-8")
        _, _, bodies = text.partition("--[[check]]")
        checks[algorithm], _, commits[algorithm] = bodies.partition("--[[commit]]")
    return "\n".join(
        (
            (lua / "prelude.lua").read_text("utf-8"),
            _dispatcher("check", "key, now, L, P, B, c", checks),
            _dispatcher("commit", "key, now, L, P, B, c, r, token", commits),
            (lua / "batch.lua").read_text("utf-8"),
        )
    )


class RedisEngine:
    """Decide requests atomically in Redis; safe to share between threads.

    `client` is a redis-py client (django-redis's `get_redis_connection()` hands one
    out). Time comes from the server's clock unless `evaluate()` is given `now`. With a
    `breaker`, consecutive failures make calls fail fast for its cool-down.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "rl:",
        version_key: str | None = None,
        stats: bool = True,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.client: Any = client  # redis-py types sync and async replies as one union
        self.breaker = breaker
        self.prefix = prefix
        self.version_key = version_key
        self._script = client.register_script(batch_source())
        self._head = ["", "", version_key or "", f"{prefix}s:" if stats else ""]

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        args: list[Any] = self._head.copy()
        if now is not None:
            args[0] = to_us(now)
        token = None
        keys = []
        for limit in limits:
            keys.append(base_key(self.prefix, limit))
            if token is None and limit.algorithm in TOKEN_ALGORITHMS:
                token = args[1] = new_token()
            args += (
                limit.algorithm,
                limit.limit,
                period_us(limit),
                burst_of(limit),
                limit.cost,
                1 if limit.shadow else 0,
                limit.name,
                limit.key[:OFFENDER_CHARS].encode("utf-8", "surrogatepass"),
            )
        reply = self._run(keys, args)
        if len(reply) != 3 + FIELDS * len(limits):
            raise EngineError(f"unexpected reply from the batch script: {reply!r}")
        version = int(reply[0]) if self.version_key else None
        return assemble(limits, reply[3:], admitted=reply[1] == 1, version=version, token=token)

    def _run(self, keys: list[str], args: list[Any]) -> Any:
        breaker = self.breaker
        if breaker is not None and not breaker.allow():
            raise EngineUnavailable("circuit open after repeated store failures")
        try:
            # Script.__call__ sends EVALSHA and reloads the source on NOSCRIPT, so a
            # restarted server or a SCRIPT FLUSH costs one extra round trip, once.
            reply = self._script(keys=keys, args=args)
        except UNAVAILABLE_ERRORS as exc:
            if breaker is not None:
                breaker.failure()
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            if breaker is not None:
                breaker.failure()
            raise EngineError(str(exc)) from exc
        if breaker is not None:
            breaker.success()
        return reply

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds (one round trip)."""
        if decision.token is None or (self.breaker and self.breaker.state != "closed"):
            return  # the slots expire by themselves after their period
        pipe = self.client.pipeline(transaction=False)
        for result in decision.results:
            if result.limit.algorithm == "concurrency" and result.allowed:
                members = [f"{decision.token}:{i}" for i in range(1, result.limit.cost + 1)]
                pipe.zrem(base_key(self.prefix, result.limit), *members)
        try:
            pipe.execute()
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc)) from exc

    def bump_version(self) -> int:
        """Tell every process that the policies changed; returns the new version."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        try:
            return int(self.client.incr(self.version_key))
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc)) from exc

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute (minutes since the epoch)."""
        raw = self.client.hgetall(stats_key(self.prefix, name, minute))
        return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs in one pipelined round trip."""
        pipe = self.client.pipeline(transaction=False)
        for name, minute in wanted:
            pipe.hgetall(stats_key(self.prefix, name, minute))
        return [
            {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}
            for raw in pipe.execute()
        ]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs in one pipelined round trip."""
        pipe = self.client.pipeline(transaction=False)
        for name, hour in wanted:
            pipe.zrevrange(offenders_key(self.prefix, name, hour), 0, n - 1, withscores=True)
        return [
            [(k.decode("utf-8", "surrogatepass") if isinstance(k, bytes) else k, int(v))
             for k, v in raw]
            for raw in pipe.execute()
        ]

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour."""
        raw = self.client.zrevrange(offenders_key(self.prefix, name, hour), 0, n - 1,
                                    withscores=True)
        return [(k.decode("utf-8", "surrogatepass") if isinstance(k, bytes) else k, int(v))
                for k, v in raw]

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit (current and previous windows)."""
        key = base_key(self.prefix, limit)
        if now is None:
            seconds, micros = self.client.time()
            now_us = seconds * US + micros
        else:
            now_us = to_us(now)
        win = math.floor(now_us / period_us(limit))
        self.client.delete(key, f"{key}:{win}", f"{key}:{win - 1}")

    #: renew(): per key, drop the slots already expired (reclaimed: they must not come
    #: back), push the expiry of the named ones still held (XX: a released slot stays
    #: gone; GT: never shortened), and keep the key itself alive as long.
    #: ARGV: now_us ('' = server time), then per key: period_us, member count, members.
    _RENEW_SOURCE = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local o = 2
for i = 1, #KEYS do
  local key, period, n = KEYS[i], tonumber(ARGV[o]), tonumber(ARGV[o + 1])
  local score = string.format('%.17g', now + period)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now))
  local args = {}
  for j = 1, n do
    args[#args + 1] = score
    args[#args + 1] = ARGV[o + 1 + j]
  end
  if redis.call('ZADD', key, 'XX', 'GT', 'CH', unpack(args)) > 0 then
    local ms = math.ceil(period / 1000)
    if ms < 1 then ms = 1 end
    redis.call('PEXPIRE', key, ms, 'GT')
  end
  o = o + 2 + n
end
return 1
"""

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the concurrency slots these decisions hold for another `period` from now.

        One round trip for all of them. Slots already released or expired stay gone.
        Raises EngineUnavailable when the store is out of reach.
        """
        keys: list[str] = []
        args: list[Any] = ["" if now is None else to_us(now)]
        for decision in decisions:
            if decision.token is None:
                continue
            for result in decision.results:
                limit = result.limit
                if limit.algorithm != "concurrency" or result.outcome != "a":
                    continue
                keys.append(base_key(self.prefix, limit))
                args += (period_us(limit), limit.cost)
                args += [f"{decision.token}:{i}" for i in range(1, limit.cost + 1)]
        if not keys:
            return
        script = self.__dict__.get("_renew_script")
        if script is None:
            script = self.__dict__["_renew_script"] = self.client.register_script(
                self._RENEW_SOURCE
            )
        try:
            script(keys=keys, args=args)
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc
