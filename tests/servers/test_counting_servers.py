"""Charge by outcome and lockouts served as users serve them: gunicorn workers started
cold (nothing run before them but `migrate`), the admin's own login form posted as a
browser posts it (its CSRF cookie and token), failures counted across the workers, and a
lockout that survives a restart of every worker."""

from __future__ import annotations

import http.client
import re
import time
import urllib.parse

import pytest

from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.project.settings"
LOGIN = "/admin/login/"
_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    site.run("from django.contrib.auth import get_user_model\n"
             "get_user_model().objects.create_superuser('alice', 'a@example.com', 'right')")
    site.policy(name="admin-login-failures", mode="enforce", algorithm="sliding_log",
                limit=2, period=60, key="ip", path=LOGIN, methods="POST",
                charge_on="login_failed", lockout=600)
    yield site
    site.stop()


def attempt(site: Site, password: str) -> tuple[int, str | None]:
    """(status, Retry-After) of one login, with the form's CSRF cookie and token as a
    browser sends them (each request on a new connection: any worker may answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    try:
        conn.request("GET", LOGIN)
        form = conn.getresponse()
        page = form.read().decode()
        cookie = form.getheader("Set-Cookie", "").split(";", 1)[0]
    finally:
        conn.close()
    token = _TOKEN.search(page)
    assert token is not None and cookie.startswith("csrftoken="), (form.status, page[:200])
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1),
                                   "username": "alice", "password": password,
                                   "next": "/admin/"})
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    try:
        conn.request("POST", LOGIN, body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


def test_failed_logins_are_charged_across_cold_workers_and_the_lockout_outlives_a_restart(
    site
):
    SERVERS["gunicorn-sync"](site)
    assert attempt(site, "right") == (302, None)  # a success is never charged
    assert [attempt(site, "wrong")[0] for _ in range(2)] == [200, 200]  # the form again
    status, retry = attempt(site, "wrong")  # at the limit: refused, the lockout starts
    assert status == 429 and 590 <= int(retry or 0) <= 600
    assert attempt(site, "right")[0] == 429  # the right password waits too

    site.stop()  # a deploy: every worker new, the address still locked out
    SERVERS["gunicorn-sync"](site)
    status, retry = attempt(site, "right")
    assert status == 429 and 0 < int(retry or 0) <= 600
    site.run("from ratelimits.models import Policy\n"
             "from ratelimits.ops.reset import reset_client\n"
             "reset_client(Policy.objects.get(name='admin-login-failures'), '127.0.0.1')")
    # The operator's reset ended it. A worker that refused the address remembers the
    # refusal until that entry's second is over (docs/scale-out.md, "Edits and resets seen
    # within a second"), and the reset ran in another process: within a second, then.
    deadline = time.monotonic() + 1.5
    while (answer := attempt(site, "right"))[0] == 429 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answer == (302, None)
