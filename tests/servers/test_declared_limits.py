"""The README's setup served as users serve it: a limit declared in code applies from the
first request each worker serves, and still after a restart with its quota spent.

A server imports the URLconf, and with it the views and their `@ratelimit`s, at the
first request it resolves, after the middleware was built: `runserver`, pytest-django
and `limited()` all import it first, which hid a limit that was off in every gunicorn
worker. So here nothing runs before the server but `migrate` (as a deploy does), no
policy exists but the ones the code declares, and the test's first request is the first
the site serves.
"""

from __future__ import annotations

import pytest

from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.project.settings"


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    yield site
    site.stop()


def statuses(site, n, method, path, form=None):
    return [site.send(method, path, form)[0] for _ in range(n)]


@pytest.mark.parametrize("server", SERVERS)
def test_a_declared_limit_applies_from_the_first_request_and_after_a_restart(site, server):
    start = SERVERS[server]
    start(site)
    # @ratelimit(name="quote", rate="3/m"): the workers share one count
    assert statuses(site, 3, "GET", "/quote/") == [200, 200, 200]
    status, headers, _ = site.send("GET", "/quote/")
    assert status == 429 and int(headers["retry-after"]) >= 1

    # @ratelimit(name="login", rate="5/m", key="post:username", methods="POST")
    assert statuses(site, 5, "POST", "/login/", {"username": "alice"}) == [200] * 5
    assert site.send("POST", "/login/", {"username": "alice"})[0] == 429
    assert site.send("POST", "/login/", {"username": "bob"})[0] == 200
    assert site.send("GET", "/login/")[0] == 200  # POST only

    # both are rows in the admin, as the code declares them
    site.run(
        "from ratelimits.models import Policy\n"
        "rows = {p.name: (p.declared, p.limit, p.period, p.key) for p in Policy.objects.all()}\n"
        "assert rows == {'quote': (True, 3, 60, 'ip'),"
        " 'login': (True, 5, 60, 'post:username')}, rows\n"
    )

    site.stop()  # a deploy: every worker new, the quota spent
    start(site)
    assert site.send("GET", "/quote/")[0] == 429
    assert site.send("POST", "/login/", {"username": "alice"})[0] == 429
    assert site.send("POST", "/login/", {"username": "carol"})[0] == 200


def test_a_drf_scope_of_an_operator_policy_applies_from_the_first_request(site):
    site.policy(name="uploads", mode="enforce", scope="uploads", limit=2, period=60,
                key="ip", path="*", algorithm="sliding_log")
    SERVERS["gunicorn-sync"](site)
    assert statuses(site, 2, "POST", "/api/upload/", {}) == [200, 200]
    assert site.send("POST", "/api/upload/", {})[0] == 429
    assert site.send("GET", "/quote/")[0] == 200  # the declared limit is its own
