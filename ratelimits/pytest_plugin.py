"""The pytest plugin (registered as an entry point, so installing the app enables it)::

    def test_login_refuses_the_sixth_attempt(client, ratelimits):
        ratelimits.use({"name": "login", "rate": "5/m", "path": "/login/",
                        "methods": "POST"})
        ...
        ratelimits.clock.advance(60)

`ratelimits` is `ratelimits.testing.limited()` entered for the test: no policy but the
ones you `use()` (and those declared in code), fresh counters, and a frozen clock that
starts at `ratelimits.testing.START` (a fixed midnight, where every usual window begins),
so what a test sees never depends on the second it runs at; `ratelimits.clock.freeze(t)`
moves it elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ratelimits.testing import Limits, limited


@pytest.fixture
def ratelimits() -> Iterator[Limits]:
    """Policies, clock and counters of this test, in process (see `ratelimits.testing`);
    the clock starts at `ratelimits.testing.START`."""
    with limited() as limits:
        yield limits
