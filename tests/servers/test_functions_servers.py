"""Functions of yours on the request path (a cost function, a `call:` key) under uvicorn:
whatever one raises, even `SystemExit`, fails that function only, and the worker keeps
serving."""

from __future__ import annotations

import pytest

from tests.support.workers import Site

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    # shadow: it refuses nothing, yet its cost function runs on every request it matches
    site.policy(name="watched-cost", mode="shadow", algorithm="fixed_window", limit=100,
                period=60, key="ip", path="/hello/", cost_function="tests.support.hooks.exits")
    site.policy(name="by-function", mode="enforce", algorithm="fixed_window", limit=100,
                period=60, key="call:tests.support.hooks.exits", path="/async/",
                on_error="allow")
    site.start_asgi()
    yield site
    site.stop()


def test_a_function_raising_system_exit_leaves_the_uvicorn_worker_serving(site):
    assert [site.send("GET", "/hello/")[0] for _ in range(3)] == [200] * 3
    assert [site.send("GET", "/async/")[0] for _ in range(3)] == [200] * 3
    assert site.server is not None and site.server.poll() is None  # still running
    assert site.send("GET", "/free/")[0] == 200
