"""Who a login attempt is counted as, on real servers: the account Django finds, whatever
the spelling of its name or the body it comes in, and the client's own address, whatever
it writes in X-Forwarded-For."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.login_site.settings"
# "alice" in mathematical monospace, bold, sans-serif, fullwidth and circled letters:
# Django's AuthenticationForm reads each as "alice" (NFKC)
SPELLINGS = ["".join(chr(base + ord(c) - ord("a")) for c in "alice")
             for base in (0x1D68A, 0x1D41A, 0x1D5BA, 0xFF41, 0x24D0)]
RIGHT = "right-horse"


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    site.run("from django.contrib.auth.models import User\n"
             f"User.objects.create_user('alice', password={RIGHT!r})")
    for path in ("/accounts/login/", "/api/token/"):
        site.policy(name=f"per-username{path.replace('/', '-')}", mode="enforce",
                    algorithm="sliding_log", key="post:username", path=path,
                    methods="POST", limit=5, period=900)
    yield site
    site.stop()


def request(site, method, path, body=None, **headers):
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def login_form(site, username, password):
    """Django's login form posted as a browser does: with its CSRF cookie and token."""
    _, headers = request(site, "GET", "/accounts/login/")
    token = headers["set-cookie"].split("csrftoken=", 1)[1].split(";", 1)[0]
    body = urllib.parse.urlencode({"username": username, "password": password,
                                   "csrfmiddlewaretoken": token})
    return request(site, "POST", "/accounts/login/", body, Cookie=f"csrftoken={token}",
                   **{"Content-Type": "application/x-www-form-urlencoded"})[0]


def token_json(site, username, password):
    body = json.dumps({"username": username, "password": password})
    return request(site, "POST", "/api/token/", body,
                   **{"Content-Type": "application/json"})[0]


@pytest.mark.parametrize("server", ["gunicorn-gthread", "uvicorn"])
def test_who_a_login_attempt_is_counted_as(site, server):
    SERVERS[server](site)

    # Django's LoginView: the spellings of alice's name share her five attempts
    guesses = [login_form(site, name, "guess") for name in SPELLINGS for _ in range(3)]
    assert (guesses.count(200), guesses.count(429)) == (5, 10)
    assert login_form(site, SPELLINGS[0], RIGHT) == 429
    assert login_form(site, "alice", RIGHT) == 429
    assert login_form(site, "bob", "guess") == 200

    # DRF's token view: JSON guesses are counted as form ones are
    guesses = [token_json(site, "alice", "guess") for _ in range(15)]
    assert guesses == [400] * 5 + [429] * 10
    assert token_json(site, "alice", RIGHT) == 429

    # a compat throttle (5/min): a client rotating X-Forwarded-For is still one client
    pings = [request(site, "GET", "/api/ping/", **{"X-Forwarded-For": f"198.51.100.{i}"})[0]
             for i in range(20)]
    assert (pings.count(200), pings.count(429)) == (5, 15)
