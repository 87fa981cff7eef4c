"""A concurrency policy decided by DRF's `PolicyThrottle` without the middleware, under
gunicorn and uvicorn started fresh: the slot is freed when each response is finished,
from the first request a worker serves (the receivers that free it are connected then)."""

from __future__ import annotations

import pytest

from tests.support.workers import Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.drf_only_site"


@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_throttle_without_the_middleware_frees_its_slot_from_the_first_request(
    tmp_path, private_redis, server
):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS)
    try:
        site.policy(name="one-at-a-time", mode="enforce", algorithm="concurrency", limit=1,
                    period=60, key="global", scope="items")
        if server == "gunicorn":
            site.start(1)
        else:
            site.start_asgi()
        # one at a time, each after the last one's response: every one finds the slot free
        assert [site.get("/api/items/")[0] for _ in range(5)] == [200] * 5
    finally:
        site.stop()
