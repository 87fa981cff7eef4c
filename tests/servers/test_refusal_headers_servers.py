"""A 503 refused by a policy that cannot identify the client, served as users serve it:
it carries no other policy's rate-limit headers, and charges none of them."""

from __future__ import annotations

import http.client

import pytest

from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.project.settings"
RATE_HEADERS = {"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining",
                "x-ratelimit-reset"}


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    site.policy(name="per-ip", mode="enforce", algorithm="fixed_window", limit=3,
                period=3600, key="ip", path="/free/")
    # tenant_key reads X-Tenant: without it the key raises, and this policy denies
    site.policy(name="per-tenant", mode="enforce", algorithm="fixed_window", limit=100,
                period=3600, key="call:tests.support.hooks.tenant_key", path="/free/",
                on_error="deny")
    yield site
    site.stop()


def get(site: Site, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    try:
        conn.request("GET", "/free/", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@pytest.mark.parametrize("server", ["gunicorn-gthread", "uvicorn"])
def test_a_failing_keys_503_carries_and_charges_no_other_policy(site, server):
    SERVERS[server](site)
    refused = [get(site, {}) for _ in range(5)]
    assert [status for status, _ in refused] == [503] * 5
    for _, headers in refused:
        assert headers["retry-after"] == "1"
        assert not RATE_HEADERS & set(headers), headers
    status, headers = get(site, {"X-Tenant": "acme"})
    assert status == 200
    assert headers["ratelimit"].startswith('"per-ip";r=2;')  # its first unit, not its sixth
