"""The waiting room: which admitted requests may sleep until their turn, and how many.

A request is admitted with a delay when a leaky bucket queues it or when a policy's
`max_wait` reserves it a later turn; it holds a worker while it waits. Unbounded, a few
clients filling their queues tie up every worker: victims wait behind them. So a
process lets at most `MAX_WAITING` requests wait at once, and at most
`MAX_WAITING_PER_CLIENT` of one client.

**A place is taken before the store is asked** (`seat`). A request that finds none is
decided as one that cannot wait: its delaying limits are asked with no queue and no
`max_wait`, so it passes if its turn is now, and is otherwise refused at once with the
`Retry-After` of its turn, charged nothing. No turn is reserved for a request that will
not wait for it (refused waiters once burned a global policy's capacity down to an
eighth). The place is given back as soon as the decision says the request need not wait,
else when its wait ends; and it is held in the request's state beside its concurrency
slots, so a request that fails or is cancelled at any point gives it back too
(`release`). A request cancelled while it waits (an ASGI client that went away) releases
everything it holds there and then.

**A client** is its identities under the delaying policies that count per client
(`KEY_KINDS.splittable`: ip, user, user_or_ip). Under the others everyone is one
identity (`global`), or the client picks its own (a header, a query parameter): there
the client is its IP address.

**A worker that serves one request at a time** (PEP 3333's `wsgi.multithread` False:
gunicorn's default sync worker, uWSGI without threads) has no place at all: one waiting
request would hold the whole worker, and a client within its rate once held all four
workers of a host asleep. There a request whose turn is not now is refused with its
`Retry-After` (logged once per process, and `ratelimits.W005` says so at `check
--database`). Django's test client says the same of itself but is no worker: nothing
queues behind it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

from ratelimits import runtime
from ratelimits.engine.types import Decision, Limit
from ratelimits.matching.identity import IdentityError
from ratelimits.matching.keykinds import KEY_KINDS, parse_key
from ratelimits.pipeline.release import arelease, release
from ratelimits.pipeline.state import Context, RequestState
from ratelimits.pipeline.verdict import LIMITED, Verdict

logger = logging.getLogger("ratelimits")

#: The host name Django's test client gives its requests (Django's test setup allows it).
TEST_CLIENT_HOST = "testserver"

_ADDRESS = parse_key("ip")


class Place:
    """One request's place in the waiting room; it keeps what a cancelled wait releases."""

    __slots__ = ("client", "decisions", "request", "state")

    def __init__(self, client: tuple[str, ...], request: Any = None,
                 state: RequestState | None = None) -> None:
        self.client = client
        self.request = request
        self.state = state
        #: The decisions whose turn this request waits for (`WaitingRoom.keep`).
        self.decisions: tuple[Decision, ...] = ()


class WaitingRoom:
    """The places of this process, in total and per client; given back by `leave()` or,
    as a request's held slots are, by `release()` (a place lasts until given back)."""

    slots_expire = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._by_client: dict[tuple[str, ...], int] = {}
        self._taken: set[Place] = set()
        self._kept: dict[int, Place] = {}  # id(decision) -> the place that waits for it

    def enter(self, client: tuple[str, ...], most: int, most_per_client: int,
              request: Any = None, state: RequestState | None = None) -> Place | None:
        """A place for `client` (`request`, whose `state` a cancelled wait releases);
        None (and nothing taken) when none is left."""
        with self._lock:
            mine = self._by_client.get(client, 0)
            if self._total >= most or mine >= most_per_client:
                return None
            self._total += 1
            self._by_client[client] = mine + 1
            place = Place(client, request, state)
            self._taken.add(place)
            return place

    def keep(self, place: Place, decisions: tuple[Decision, ...]) -> None:
        """`place` waits for the turn of `decisions` (found again by `kept`)."""
        with self._lock:
            if place in self._taken:
                place.decisions = decisions
                for decision in decisions:
                    self._kept[id(decision)] = place

    def kept(self, decisions: Sequence[Decision]) -> list[Place]:
        """The places kept for these decisions."""
        with self._lock:
            return list({id(p): p for d in decisions
                         if (p := self._kept.get(id(d))) is not None}.values())

    def leave(self, place: Place) -> None:
        """Give `place` back (once: again is nothing)."""
        with self._lock:
            if place not in self._taken:
                return
            self._taken.discard(place)
            for decision in place.decisions:
                self._kept.pop(id(decision), None)
            self._total -= 1
            left = self._by_client[place.client] - 1
            if left:
                self._by_client[place.client] = left
            else:
                del self._by_client[place.client]

    def waiting(self) -> int:
        """How many places are taken now."""
        with self._lock:
            return self._total

    def reset(self) -> None:
        """Forget every place (tests, between cases)."""
        with self._lock:
            self._total = 0
            self._by_client.clear()
            self._taken.clear()
            self._kept.clear()

    # -- a request's held places, given back as its slots are (`release`) ---------------

    def release(self, place: Place) -> None:
        self.leave(place)

    async def arelease(self, place: Place) -> None:
        self.leave(place)

    def renew(self, places: Sequence[Place], now: float | None = None) -> None:
        """Nothing to renew: a place lasts until given back."""


room = WaitingRoom()
runtime.on_reset(room.reset)


class _Told:
    """Whether this process said that its worker serves one request at a time (once)."""

    def __init__(self) -> None:
        self.one_at_a_time = False

    def reset(self) -> None:
        self.one_at_a_time = False


_told = _Told()
runtime.on_reset(_told.reset)


def seat(ctx: Context, planned: list[Any]) -> tuple[list[Any], Place | None]:
    """`planned` (plan.Planned) to decide, and the place this request holds meanwhile.

    Without a delaying limit: `planned` as it is, no place. With one and a place: as it
    is, with the place. With one and no place (the room is full, or the worker serves one
    request at a time): its delaying limits made ones that cannot wait, no place.
    """
    delaying = [p for p in planned if p.policy.may_wait and may_delay(p.limit)]
    if not delaying:
        return planned, None
    config = ctx.config
    if one_at_a_time(ctx.base):
        _say_one_at_a_time(delaying)
    else:
        place = room.enter(_client(ctx, delaying), config["MAX_WAITING"],
                           config["MAX_WAITING_PER_CLIENT"], ctx.request, ctx.state)
        if place is not None:
            return planned, place
    return [dataclasses.replace(p, limit=no_wait(p.limit)) if may_delay(p.limit) else p
            for p in planned], None


def settle(state: RequestState, place: Place | None, verdict: Verdict | None) -> None:
    """After the decision made with `place`: kept while the request waits for its turn
    (and held in its state, given back however the request ends), else given back now."""
    if place is None:
        return
    if verdict is not None and verdict.allowed and verdict.delay > 0:
        room.keep(place, verdict.decisions)
        state.holds = [*state.holds, (room, place)]
    else:
        room.leave(place)


def vacate(place: Place | None) -> None:
    """Give `place` back (the decision made with it failed)."""
    if place is not None:
        room.leave(place)


def may_delay(limit: Limit) -> bool:
    """Whether `limit` may admit a request with a delay (an enforced leaky bucket with a
    queue, or a `max_wait`)."""
    if limit.shadow:  # a shadow limit's delay is never waited for
        return False
    return limit.max_wait > 0 or (limit.spec.delays and limit.spec.burst_of(limit) > 0)


def no_wait(limit: Limit) -> Limit:
    """`limit` for a request that cannot wait: no queue, no `max_wait`."""
    return dataclasses.replace(limit, max_wait=0.0,
                               burst=0 if limit.spec.delays else limit.burst)


def one_at_a_time(base: Any) -> bool:
    """Whether the worker serving `base` (an HttpRequest) serves one request at a time."""
    meta = getattr(base, "META", None) or {}
    return meta.get("wsgi.multithread") is False and meta.get("SERVER_NAME") != TEST_CLIENT_HOST


def _say_one_at_a_time(delaying: Sequence[Any]) -> None:
    if _told.one_at_a_time:
        return
    _told.one_at_a_time = True
    names = ", ".join(sorted({repr(p.policy.name) for p in delaying}))
    logger.warning(
        "ratelimits: policy %s would have requests wait for their turn, but this worker "
        "serves one request at a time (wsgi.multithread is False: gunicorn's sync worker, "
        "uWSGI without threads), and a wait would hold it whole: a request whose turn is "
        "not now is refused with its Retry-After instead, charged nothing. Serve with "
        "threads (gunicorn -k gthread --threads N) or ASGI (uvicorn) for requests to "
        "wait (logged once per process).", names)


def _client(ctx: Context, delaying: Sequence[Any]) -> tuple[str, ...]:
    """Who waits: the request's identities under the delaying policies that count per
    client, else its IP address."""
    mine = sorted({p.identity for p in delaying
                   if p.policy.key_spec.kind in KEY_KINDS.splittable})
    if mine:
        return tuple(mine)
    config = ctx.config
    try:
        address = _ADDRESS.identify(ctx.request, trusted_proxies=config["TRUSTED_PROXIES"],
                                    ipv6_prefix=config["IPV6_PREFIX"],
                                    proxy_header=config["PROXY_HEADER"])
    except IdentityError:
        address = None
    return (address or "ip:?",)


def wait_turn(verdict: Verdict) -> Verdict:
    """Hold an admitted, delayed request until its turn, in the place it took.

    Returns the verdict to act on: the same one after the wait, or a 429 at once for a
    verdict decided without a place (not by the decision flow). A request stopped while
    it waits releases what it holds.
    """
    places = room.kept(verdict.decisions)
    if not places:
        return _no_room(verdict)
    try:
        sleep(verdict.delay)
    except BaseException:
        for place in places:
            if place.state is not None:
                release(place.request, place.state)
        raise
    finally:
        for place in places:
            room.leave(place)
    return verdict


async def await_turn(verdict: Verdict) -> Verdict:
    """`wait_turn` for the async stack: the event loop serves others meanwhile. A task
    cancelled while it waits (the client went away) releases what the request holds."""
    places = room.kept(verdict.decisions)
    if not places:
        return _no_room(verdict)
    try:
        await asleep(verdict.delay)
    except BaseException:
        for place in places:
            room.leave(place)
            if place.state is not None:
                # shielded: a second cancellation must not stop the release half-way
                await asyncio.shield(arelease(place.request, place.state))
        raise
    finally:
        for place in places:
            room.leave(place)
    return verdict


def _no_room(verdict: Verdict) -> Verdict:
    """No place: refuse now, telling the client when its turn would be."""
    turn = max((d.delay for d in verdict.decisions), default=verdict.delay)  # not capped
    return dataclasses.replace(
        verdict, status=LIMITED, delay=0.0, own_retry_after=max(1, math.ceil(turn))
    )


def sleep(seconds: float) -> None:
    """Hold an admitted, delayed request, on the installed clock (a test's clock moves
    instead)."""
    runtime.clock().sleep(seconds)


async def asleep(seconds: float) -> None:
    """The async stack's `sleep`: the event loop serves others meanwhile."""
    await runtime.clock().asleep(seconds)
