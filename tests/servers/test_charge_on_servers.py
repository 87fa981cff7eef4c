"""Charge by outcome against clients that do not wait for their answers, on real servers:

- a burst of wrong codes (or passwords) at once runs the view at most `limit` times for a
  client, under uvicorn as under gunicorn's threads and sync workers: a request in flight
  holds its unit until its response says whether it stays charged;
- a client that closes its connection before the answer is charged all the same (under
  ASGI, Django cancels the request's task, and the view's thread runs on regardless).
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.servers.test_waiting_servers import ask
from tests.support.workers import SERVERS, Site

pytestmark = pytest.mark.slow

#: The recipe's OTP policy: three wrong codes per 10 minutes and address, then 429. With
#: `on_error` deny, a store call lost on this busy machine is a 503, never a view run
#: uncharged (what `on_error` allow would do, whatever the count says).
OTP = {"name": "otp", "mode": "enforce", "algorithm": "sliding_window", "limit": 3,
       "period": 600, "key": "ip", "path": "/otp/", "charge_on": "404", "on_error": "deny"}


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


def checks(server, counter: str = "otp-checks") -> int:
    """How many times the view ran (it counts itself in the store)."""
    return int(redis.Redis.from_url(server.url).get(counter) or 0)


def burst(n: int, one) -> list[int]:
    """`n` requests sent at once, each on its own connection."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: one(), range(n)))


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn-gthread", "gunicorn-sync"])
def test_a_burst_of_wrong_codes_runs_the_view_at_most_limit_times(site, private_redis,
                                                                  server):
    site.policy(**OTP)
    SERVERS[server](site)
    statuses = burst(50, lambda: ask(site.port, "/otp/?code=000000", "127.0.0.2")[0])
    ran = checks(private_redis)
    print(f"\n{server}: 50 wrong codes at once against a limit of 3: {ran} checked, "
          f"{statuses.count(429)} refused")
    assert ran <= OTP["limit"]
    assert statuses.count(404) == ran, statuses
    assert statuses.count(429) + statuses.count(503) == 50 - ran, statuses
    assert ask(site.port, "/otp/?code=246810", "127.0.0.2")[0] == 429
    # another address was never charged: a right code passes, and costs nothing
    assert [ask(site.port, "/otp/?code=246810", "127.0.0.3")[0] for _ in range(5)] == [204] * 5


def test_a_burst_of_wrong_passwords_at_django_login_view_checks_at_most_limit_under_uvicorn(
    site, private_redis
):
    """The login recipe's policy on Django's LoginView (a failed login is a 200)."""
    site.run("from django.contrib.auth import get_user_model\n"
             "get_user_model().objects.create_user('alice', 'a@example.com', 'right')")
    site.policy(name="login-failures-per-address", mode="enforce", algorithm="sliding_log",
                limit=20, period=900, key="ip", path="/accounts/login/", methods="POST",
                charge_on="login_failed", lockout=3600, on_error="deny")
    site.start_asgi()
    body = urllib.parse.urlencode({"username": "alice", "password": "wrong"})

    def guess() -> int:
        conn = socket.create_connection(("127.0.0.1", site.port), timeout=30,
                                        source_address=("127.0.0.2", 0))
        try:
            conn.sendall((f"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          f"Content-Type: application/x-www-form-urlencoded\r\n"
                          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                          f"{body}").encode())
            return int(conn.makefile("rb").readline().split()[1])
        finally:
            conn.close()

    statuses = burst(50, guess)
    ran = checks(private_redis, "password-checks")
    print(f"\nuvicorn, LoginView: 50 wrong passwords at once against 20 per 15 min: "
          f"{ran} password checks, {statuses.count(429)} refused")
    assert ran <= 20, statuses
    assert statuses.count(200) == ran, statuses
    assert statuses.count(429) + statuses.count(503) == 50 - ran, statuses


def test_a_client_that_closes_before_its_answer_is_charged_under_uvicorn(site,
                                                                        private_redis):
    """The view (30 ms) runs on after its client went away 10 ms after sending: its
    request stays charged, so such attempts run the view at most `limit` times, and
    then the client is refused before the view."""
    site.policy(**OTP)
    site.start_asgi()
    # served once first (another address): the policies loaded, the view imported
    assert ask(site.port, "/otp/?code=246810", "127.0.0.3")[0] == 204
    base = checks(private_redis)
    sent = 0
    while checks(private_redis) - base < OTP["limit"] and sent < 30:
        sent += 1
        ran = checks(private_redis)
        sock = socket.create_connection(("127.0.0.1", site.port), timeout=10,
                                        source_address=("127.0.0.2", 0))
        sock.sendall(b"GET /otp/?code=000000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.01)
        sock.close()
        # one attempt at a time: the view it started (if it got that far) is done
        deadline = time.monotonic() + 0.5
        while checks(private_redis) == ran and time.monotonic() < deadline:
            time.sleep(0.01)
    ran = checks(private_redis) - base
    status = ask(site.port, "/otp/?code=246810", "127.0.0.2")[0]
    print(f"\nuvicorn: {sent} wrong codes, each client gone 10 ms after sending: "
          f"{ran} checked; the next request: {status}")
    assert 0 < ran <= OTP["limit"]
    assert status == 429
