"""Every engine test runs against both backends: Redis (real server) and in-process."""

from __future__ import annotations

import pytest

from ratelimits.engine import MemoryEngine, RedisEngine

#: An epoch second aligned to every window used in the tables (divisible by 3600).
T0 = 1_800_000_000.0


@pytest.fixture(params=["redis", "memory"])
def engine(request: pytest.FixtureRequest):
    if request.param == "redis":
        client = request.getfixturevalue("redis_client")
        return RedisEngine(client, version_key="rl:version")
    return MemoryEngine(version_key="rl:version")
