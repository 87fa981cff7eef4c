"""Celery tasks under the admin's policies: `limited_task`, a global rate for every worker.

Celery's own `rate_limit` paces each worker apart, so four workers with `rate_limit="5/s"`
call a partner twenty times a second. ``@limited_task("partner-api", rate="5/s")`` under
``@app.task(bind=True)`` takes a turn of the policy `partner-api` (`ratelimits.limit()`)
before each run: decided in the store, so every worker process shares one pace, and
operated from the admin like any other policy (shadow, off, overrides, figures).

A wait up to `timeout` is waited in place. A longer one would hold a worker process that
could run other tasks meanwhile: the task is retried instead, as Celery retries
(``self.retry(exc=..., countdown=...)``), its countdown the seconds until a turn could
pass. The task's `max_retries` applies as to any retry: past it, `Limited` is raised.

Nothing else in the package imports this module, and only this module imports Celery,
which stays an optional dependency (the `celery` extra).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task
from django.core.exceptions import ImproperlyConfigured

from ratelimits.limiting import Limited, limit

__all__ = ["limited_task"]

F = TypeVar("F", bound=Callable[..., Any])


def limited_task(name: str, *, rate: str | None = None, key: Any = None, cost: int = 1,
                 timeout: float | None = None, algorithm: str = "gcra",
                 burst: int | None = None, mode: str = "enforce") -> Callable[[F], F]:
    """Run a bound task only with a turn of policy `name`, retrying it with the turn's
    countdown when none comes within `timeout`.

    The arguments are `limit()`'s, except `key`: a value (a tenant, an API key) or a
    function that takes the task's arguments (without `self`) and returns it, e.g.
    ``key=lambda tenant, email: tenant``; each value has its own count. Goes under
    ``@app.task(bind=True)``: the retry is the task's own.
    """
    turn = limit(name, rate=rate, key=None if callable(key) else key, cost=cost,
                 timeout=timeout, algorithm=algorithm, burst=burst, mode=mode)

    def turn_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> limit:
        if not callable(key):
            return turn
        # the policy is `turn`'s (declared once, above): only the key differs per call
        return limit(name, key=key(*args, **kwargs), cost=cost, timeout=timeout)

    def decorate(run: F) -> F:
        if isinstance(run, Task):
            raise ImproperlyConfigured(
                f"limited_task({name!r}) on the task {run.name}: put @limited_task below "
                "@app.task(bind=True), next to the function, so that it limits each run")

        @functools.wraps(run)
        def limited(task: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(task, Task):
                raise ImproperlyConfigured(
                    f"limited_task({name!r}) on {run.__qualname__}: declare the task with "
                    "@app.task(bind=True), above @limited_task, so that it can be retried")
            with contextlib.ExitStack() as held:
                try:
                    held.enter_context(turn_for(args, kwargs))
                except Limited as refused:
                    raise task.retry(exc=refused, countdown=refused.retry_after) from refused
                return run(task, *args, **kwargs)

        return limited  # type: ignore[return-value]

    return decorate
