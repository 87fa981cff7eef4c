"""django-ratelimit 4's public API, decided by the ratelimits engine.

Change `from django_ratelimit.decorators import ratelimit` to
`from ratelimits.compat.django_ratelimit.decorators import ratelimit` (and likewise for
`core`, `exceptions` and `middleware`): each limit becomes a policy declared in code,
exact across processes, one store call, shown in the admin. See
docs/migrating/django-ratelimit.md for what differs, and why.
"""

from __future__ import annotations

__all__ = ["ALL", "UNSAFE"]

#: Every HTTP method (django-ratelimit's sentinel, compared by value).
ALL: tuple[None] = (None,)
#: The methods that change state.
UNSAFE: list[str] = ["DELETE", "PATCH", "POST", "PUT"]
