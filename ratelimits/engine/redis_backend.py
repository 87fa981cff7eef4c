"""The production engine: every limit of a request decided in one EVALSHA on Redis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import redis

from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.contract import batch_source, decode, encode, renew_source
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.keys import (
    US,
    base_key,
    guaranteed,
    offender_errors_key,
    offenders_key,
    period_us,
    stats_key,
    to_us,
)
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import Decision, Limit

__all__ = ["UNAVAILABLE_ERRORS", "RedisEngine", "batch_source"]

#: Errors that mean "the store is out of reach", as opposed to a bug in what we sent.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.BusyLoadingError,
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
        self._renew_script: Any = None
        self.stats = stats

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        keys, args, token = encode(
            limits, prefix=self.prefix, now=now, version_key=self.version_key,
            stats=self.stats,
        )
        reply = self._run(keys, args)
        try:
            return decode(limits, reply, versioned=bool(self.version_key), token=token)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

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
        for limit, members in decision.holding():
            pipe.zrem(base_key(self.prefix, limit), *members)
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
            # a list holds at most OFFENDERS_CAP members: read it whole to rank it
            pipe.zrange(offenders_key(self.prefix, name, hour), 0, -1, withscores=True)
            pipe.hgetall(offender_errors_key(self.prefix, name, hour))
        replies = pipe.execute()
        out = []
        for raw, raw_errors in zip(replies[::2], replies[1::2], strict=True):
            counts = {_text(k): int(v) for k, v in raw}
            errors = {_text(k): int(v) for k, v in raw_errors.items()}
            out.append(guaranteed(counts, errors, n))
        return out

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most (with would-be refusals) in one hour, by
        guaranteed count: refusals each one certainly had (see `keys.guaranteed`)."""
        return self.offenders_many([(name, hour)], n)[0]

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit (current and previous windows)."""
        key = base_key(self.prefix, limit)
        if not REGISTRY[limit.algorithm].windowed:
            self.client.delete(key)
            return
        if now is None:
            seconds, micros = self.client.time()
            now_us = seconds * US + micros
        else:
            now_us = to_us(now)
        win = math.floor(now_us / period_us(limit))
        self.client.delete(key, f"{key}:{win}", f"{key}:{win - 1}")


    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another `period` from now.

        One round trip for all of them. Slots already released or expired stay gone.
        Raises EngineUnavailable when the store is out of reach.
        """
        keys: list[str] = []
        args: list[Any] = ["" if now is None else to_us(now)]
        for decision in decisions:
            for limit, members in decision.holding():
                keys.append(base_key(self.prefix, limit))
                args += (period_us(limit), len(members), *members)
        if not keys:
            return
        if self._renew_script is None:  # built on first use: most sites hold no slots
            self._renew_script = self.client.register_script(renew_source())
        try:
            self._renew_script(keys=keys, args=args)
        except UNAVAILABLE_ERRORS as exc:
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        except redis.RedisError as exc:
            raise EngineError(str(exc)) from exc


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
