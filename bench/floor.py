"""The floor no rate limiter that decides in Redis can beat: a middleware that makes the
one round trip a decided request makes, one redis-py `EVALSHA` of `return 1`, and nothing
else (no policy, no key, no headers). Sections 3 and 9 read our figures against it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import redis

#: The script: a call to the server's Lua, answered at once.
SCRIPT = "return 1"


def floor_client(url: str | None = None) -> Any:
    """The floor's script, registered on a client of its own (`url`, else `REDIS_URL`)."""
    client = redis.Redis.from_url(url or os.environ["REDIS_URL"])
    return client.register_script(SCRIPT)


class FloorMiddleware:
    """One `EVALSHA` per request, then the view."""

    def __init__(self, get_response: Callable[[Any], Any], script: Any = None) -> None:
        self.get_response = get_response
        self.script = script if script is not None else floor_client()

    def __call__(self, request: Any) -> Any:
        self.script()
        return self.get_response(request)
