"""A policy on GET holds for the other methods a view function answers with its GET body,
served as users serve it: OPTIONS sent to a plain `def` view under gunicorn and uvicorn."""

from __future__ import annotations

import pytest

from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.project.settings"

@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    # /free/ is a view function: it runs its body for OPTIONS as for GET
    site.policy(name="free-reads", mode="enforce", algorithm="fixed_window", limit=3,
                period=3600, key="ip", path="/free/", methods="GET")
    yield site
    site.stop()


@pytest.mark.parametrize("server", ["gunicorn-gthread", "uvicorn"])
def test_options_to_a_view_function_spends_the_get_policys_quota(site, server):
    SERVERS[server](site)
    answers = [site.send("OPTIONS", "/free/") for _ in range(8)]
    assert [status for status, _, _ in answers] == [200] * 3 + [429] * 5
    assert [body for _, _, body in answers[:3]] == ["free"] * 3  # the view ran
    assert site.send("GET", "/free/")[0] == 429  # one quota for both
