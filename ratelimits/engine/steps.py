"""One decision written once, run by a blocking caller and by an async one.

A decision that needs the store (or anything else that may block) is written as a
generator that yields what it needs done and is sent the result (or has the error
thrown in, so its own `try` blocks see it). `drive` does each need in the calling
thread; `adrive` awaits it. Both return what the generator returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Steps", "adrive", "drive"]

T = TypeVar("T")
Steps = Generator[Any, Any, T]


def drive(steps: Steps[T], perform: Callable[[Any], Any]) -> T:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            need = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        value, error = None, None
        try:
            value = perform(need)
        except BaseException as exc:  # a cancelled task too: the steps clean up, re-raise
            error = exc


async def adrive(steps: Steps[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            need = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            result: T = done.value
            return result
        value, error = None, None
        try:
            value = await perform(need)
        except BaseException as exc:  # a cancelled task too: the steps clean up, re-raise
            error = exc
