"""What each kind of engine offers, declared once: the request path and the wrappers
depend on these, never on a concrete engine or on attribute probes.

- `Holder`: what a request's held slots go back to (every engine, and the adaptive one).
- `Engine`: what every engine that decides limits offers (`MemoryEngine`, `RedisEngine`,
  `ClusterEngine`, and `LocalFirst` in front of one of them).
- `StoreEngine`: an engine on a shared store, with leases and a client (`RedisEngine`,
  `ClusterEngine`, `PostgresEngine`, `LocalFirst`).
- `Watch`: the connection of a store engine that hears its changes (`watch.ChangeWatch`
  on Redis, `watch.ListenWatch` on PostgreSQL), read by `pipeline.changes`.
- `AsyncEngine`: the async half of a `StoreEngine`, awaited on the event loop (the
  asyncio twins of `engine.aio`).
- `LocalLayer`: an engine a process decides in alone, in front of the store: it takes a
  request's units now and gives them back when the store (or another layer) refuses it
  (`MemoryEngine` for per-process policies, `AdaptiveEngine`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ratelimits.engine.acquire import Clock
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.types import Decision, Limit
from ratelimits.engine.watch import Change

__all__ = ["AsyncEngine", "Engine", "Holder", "LocalLayer", "StoreEngine", "Watch"]


class Holder(Protocol):
    """An engine whose admitted decisions may hold slots until the request releases them."""

    @property
    def slots_expire(self) -> bool:
        """Whether held slots expire after their period unless `renew()` keeps them (the
        watchdog renews them then); False when they last until released."""

    def release(self, decision: Decision) -> None:
        """Free the slots an admitted decision holds."""

    async def arelease(self, decision: Decision) -> None:
        """`release()` for async code."""

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another period from now."""


class Engine(Holder, Protocol):
    """An engine that decides a request's limits, counts what it decided and reads it back."""

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""

    async def aevaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """`evaluate()` for async code."""

    def acquire(self, limits: Sequence[Limit], timeout: float | None = None, *,
                clock: Clock | None = None) -> Decision:
        """Block until every limit admits one call, or until `timeout`."""

    async def aacquire(self, limits: Sequence[Limit], timeout: float | None = None, *,
                       clock: Clock | None = None) -> Decision:
        """`acquire()` for async code."""

    def read_version(self, now: float | None = None) -> int:
        """The policy version."""

    async def aread_version(self) -> int:
        """`read_version()` for async code."""

    def bump_version(self) -> int:
        """Tell every reader that the policies changed; the new version."""

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit."""

    def close(self) -> None:
        """Send what is still kept in process and stop the engine's threads."""

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision made in process (not by this engine's own call)."""

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute."""

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute."""

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs."""

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most in one hour."""

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs."""

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name`: its counters and offenders."""

    @property
    def live_instances(self) -> int | None:
        """Processes sharing the limits at the last heartbeat (None: none learnt)."""


class Watch(Protocol):
    """A connection of its own that hears what changes in the store (see `engine.watch`).
    Used by one thread, but for `pending()` (any thread) and `close()` (any thread: a
    `wait()` in the other returns). Raises the store's errors, or `ConnectionError`, once
    the connection is lost."""

    def open(self) -> None:
        """Connect, and ask the store for the messages."""

    def wait(self, timeout: float) -> bool:
        """Whether something came within `timeout` seconds (nothing is read)."""

    def pending(self) -> bool:
        """Whether something came that `read()` has not read (an answer at once)."""

    def read(self) -> list[Change]:
        """The changes that came (after `wait()` said something did; the answer to a
        `ping()` is read and says none)."""

    def ping(self) -> None:
        """Ask the store for a sign of life: its answer comes, for `wait()` and `read()`."""

    def close(self) -> None:
        """Close the connection."""


class StoreEngine(Engine, Protocol):
    """An engine on a store shared between processes: leases, its tally, its client."""

    def lease(self, limits: Sequence[Limit], now: float | None = None, *,
              back: Sequence[Leftover] = ()) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits`, after giving back `back`."""

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases; the units taken back."""

    def flush(self) -> None:
        """Send what `count_locally` tallied now."""

    def watch(self) -> Watch | None:
        """A connection that hears the policy version written, a reset announced and the
        store flushed (see `engine.watch`); None when this store cannot tell."""

    def announce_reset(self, name: str) -> None:
        """Tell every process's watch that clients of policy `name` were reset."""

    @property
    def client(self) -> Any:
        """The client the engine talks through (redis-py's, of a server or a cluster; this
        thread's psycopg connection)."""


class AsyncEngine(Protocol):
    """The request path's calls of a `StoreEngine`, awaited on the event loop."""

    async def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits."""

    async def read_version(self, now: float | None = None) -> int:
        """The policy version."""

    async def release(self, decision: Decision) -> None:
        """Free the slots an admitted decision holds."""

    async def lease(self, limits: Sequence[Limit], now: float | None = None, *,
                    back: Sequence[Leftover] = ()) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits`, after giving back `back`."""


class LocalLayer(Holder, Protocol):
    """An engine this process decides in alone, all or nothing with the store."""

    def take(self, limits: Sequence[Limit], now: float | None = None
             ) -> tuple[Decision, Any]:
        """Decide and charge `limits`: the decision, and a receipt `refund()` takes back
        (None when nothing was charged)."""

    def refund(self, receipt: Any) -> Decision:
        """Give back what `take()` charged (something else refused the request): the
        decision as if it had been refused here."""
