"""The waiting room: how many admitted requests may sleep at once.

A request is admitted with a delay when a leaky bucket queues it or when a policy's
`max_wait` reserves it a later turn; it holds a worker while it waits. Unbounded, a few
clients filling their queues tie up every sync worker: victims wait behind them and the
attackers' own 429s queue too. So a process lets at most `MAX_WAITING` requests wait at
once, and at most `MAX_WAITING_PER_CLIENT` of one client; a request that finds no room is
refused at once with a 429 instead of waiting. The counts are kept under a lock that is
never held while anyone sleeps.
"""

from __future__ import annotations

import dataclasses
import math
import threading

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.pipeline.verdict import LIMITED, Verdict


class WaitingRoom:
    """Counts the requests waiting in this process, in total and per client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._by_client: dict[tuple[str, ...], int] = {}

    def enter(self, client: tuple[str, ...], most: int, most_per_client: int) -> bool:
        """Take a place for `client`; False (and nothing taken) when none is left."""
        with self._lock:
            mine = self._by_client.get(client, 0)
            if self._total >= most or mine >= most_per_client:
                return False
            self._total += 1
            self._by_client[client] = mine + 1
            return True

    def leave(self, client: tuple[str, ...]) -> None:
        with self._lock:
            self._total -= 1
            left = self._by_client[client] - 1
            if left:
                self._by_client[client] = left
            else:
                del self._by_client[client]

    def waiting(self) -> int:
        """How many requests are waiting now."""
        with self._lock:
            return self._total

    def reset(self) -> None:
        """Forget every waiting request (tests, between cases)."""
        with self._lock:
            self._total = 0
            self._by_client.clear()


room = WaitingRoom()
runtime.on_reset(room.reset)


def wait_turn(verdict: Verdict) -> Verdict:
    """Hold an admitted, delayed request for its delay if the waiting room has a place.

    Returns the verdict to act on: the same one after the wait, or a 429 at once.
    """
    config = get_config()
    client = _waiter(verdict)
    if not room.enter(client, config["MAX_WAITING"], config["MAX_WAITING_PER_CLIENT"]):
        return _no_room(verdict)
    try:
        sleep(verdict.delay)
    finally:
        room.leave(client)
    return verdict


async def await_turn(verdict: Verdict) -> Verdict:
    """`wait_turn` for the async stack: the event loop serves others meanwhile."""
    config = get_config()
    client = _waiter(verdict)
    if not room.enter(client, config["MAX_WAITING"], config["MAX_WAITING_PER_CLIENT"]):
        return _no_room(verdict)
    try:
        await asleep(verdict.delay)
    finally:
        room.leave(client)
    return verdict


def _waiter(verdict: Verdict) -> tuple[str, ...]:
    """Who waits: the clients of the policies that delay this request."""
    return tuple(
        sorted({o.identity for o in verdict.outcomes if o.result is not None and o.result.delay})
    )


def _no_room(verdict: Verdict) -> Verdict:
    """No waiting room left: refuse now, telling the client when its turn would be."""
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
