"""I/O written once as a flow, run by a blocking caller and by an async one.

A flow is a generator that yields what it needs done (a store call, a Redis command,
anything that may block) and is sent the result, or has the error thrown in, so that
its own `try` blocks see it. `run_flow` performs each need in the calling thread;
`arun_flow` awaits it. Both return what the flow returns. A decision, the Redis
transport (`transport`, `functions`, `heartbeat`) and a lease are flows: the engine and its
asyncio twin (`engine.aio`) differ only in how they perform a need.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Flow", "arun_flow", "run_flow"]

T = TypeVar("T")
Flow = Generator[Any, Any, T]


def _resume(flow: Flow[Any], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Send `value` into `flow` (or throw `error` into it): (False, its next need), or
    (True, what it returned). A plain tuple: this runs several times per request."""
    try:
        return False, (flow.send(value) if error is None else flow.throw(error))
    except StopIteration as done:
        return True, done.value


def run_flow(flow: Flow[T], perform: Callable[[Any], Any]) -> T:
    """Run `flow` to its end, each need performed by `perform(need)` in this thread.
    (`_resume`'s steps written out: this runs for every request.)"""
    send, throw = flow.send, flow.throw
    try:
        need = send(None)
        while True:
            try:
                value = perform(need)
            except BaseException as exc:  # the flow cleans up, or recovers, or re-raises
                need = throw(exc)
            else:
                need = send(value)
    except StopIteration as done:
        result: T = done.value
        return result


async def arun_flow(flow: Flow[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """`run_flow` for async code: each need is awaited (`await perform(need)`)."""
    done, need = _resume(flow, None, None)
    while not done:
        try:
            value, error = await perform(need), None
        except BaseException as exc:  # a cancelled task too: the flow cleans up, re-raises
            value, error = None, exc
        done, need = _resume(flow, value, error)
    result: T = need
    return result
