"""Waiting for a turn under real servers, started as users start them.

- uvicorn: a client that goes away while its request waits for its turn gives back the
  concurrency slot (or the adaptive policy's place) the request held.
- gunicorn, sync workers: a client sending within its rate, to a queueing policy, holds
  no worker asleep, so a victim on an unlimited page keeps its throughput.
- uvicorn: a flood at a global policy with `max_wait` is served at the policy's rate:
  turns go to requests that wait for them, not to those the waiting room refuses.

Clients are told apart by their source address (any of 127.0.0.0/8 reaches the server);
the store is a private redis-server. Throughput is measured over short real runs, as
tests/pipeline/test_adaptive_servers.py does; the figures are printed.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest
import redis

from ratelimits.engine.keynames import base_key
from ratelimits.engine.types import Limit
from tests.settings import RATELIMITS
from tests.support.workers import Site

pytestmark = pytest.mark.slow


def ask(port: int, path: str, source: str) -> tuple[int, dict[str, str]]:
    """(status, headers with lower-case names) of one GET from address `source`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def send_and_hold(port: int, path: str, source: str) -> socket.socket:
    """A GET from `source` whose client will go away (close the socket) without reading."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20,
                                    source_address=(source, 0))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def until(condition, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


# -- uvicorn: a client gone while its request waits -------------------------------------------

#: One request per 3 s per address, waiting up to 4 s for a turn.
PACED = {"name": "paced", "mode": "enforce", "algorithm": "gcra", "limit": 1, "period": 3,
         "burst": 1, "max_wait": 4, "key": "ip", "path": "/async/"}


def slots_held(server, name: str, limit: int) -> int:
    key = base_key(RATELIMITS["KEY_PREFIX"], Limit("global", "concurrency", limit, 30, name=name))
    return int(redis.Redis.from_url(server.url).zcard(key))


@pytest.mark.parametrize("held", ["concurrency", "adaptive"])
def test_a_client_gone_while_it_waits_gives_its_place_back_under_uvicorn(
    site, private_redis, held
):
    if held == "concurrency":  # two such clients held a limit of 2 at zero for good
        site.policy(name="slots", mode="enforce", algorithm="concurrency", limit=2, period=30,
                    key="global", path="/async/")
        gone, marker = ["127.0.0.2", "127.0.0.3"], ("slots", 2)
    else:  # one such client held an adaptive policy at a 503 for good
        site.policy(name="capacity", mode="enforce", algorithm="adaptive", limit=1, floor=1,
                    period=60, key="global", path="/async/")
        # a wide concurrency limit beside it: its slot shows when the request was decided
        site.policy(name="marker", mode="enforce", algorithm="concurrency", limit=10,
                    period=30, key="global", path="/async/")
        gone, marker = ["127.0.0.2"], ("marker", 10)
    site.policy(**PACED)
    site.start_asgi()
    for source in gone:
        assert ask(site.port, "/async/", source)[0] == 200  # its turn is now
    # their next requests wait 3 s for their turns, holding what they took
    sockets = [send_and_hold(site.port, "/async/", source) for source in gone]
    until(lambda: slots_held(private_redis, *marker) == len(gone), "the requests never waited")
    for sock in sockets:
        sock.close()  # the clients go away mid-wait
    until(lambda: slots_held(private_redis, *marker) == 0,
          "the slots of the requests gone are still held")
    assert ask(site.port, "/async/", "127.0.0.9")[0] == 200


# -- gunicorn sync workers: a client within its rate and a victim -----------------------------


def closed_loop(port: int, path: str, source: str, clients: int, seconds: float,
                polite: bool = False) -> list[tuple[int, dict[str, str]]]:
    """`clients` threads from `source` asking `path` one request after another for
    `seconds`; `polite` ones wait for a refusal's Retry-After first."""
    answers: list[tuple[int, dict[str, str]]] = []
    end = time.monotonic() + seconds

    def run() -> None:
        while time.monotonic() < end:
            status, headers = ask(port, path, source)
            answers.append((status, headers))
            if polite and status == 429:
                time.sleep(min(float(headers["retry-after"]), max(0.0, end - time.monotonic())))

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return answers


def test_a_client_waiting_its_turns_keeps_no_sync_worker_asleep(site):
    # one request a second per address, up to 4 queued (the last waits 4 s)
    site.policy(name="queue", mode="enforce", algorithm="leaky_bucket", limit=1, period=1,
                burst=4, key="ip", path="/hello/")
    site.start(4)  # gunicorn's default worker class: sync, one request at a time
    alone = len(closed_loop(site.port, "/free/", "127.0.0.3", 4, 2.0))
    result: list[tuple[int, dict[str, str]]] = []
    client = threading.Thread(target=lambda: result.extend(
        closed_loop(site.port, "/hello/", "127.0.0.2", 4, 4.0, polite=True)))
    client.start()
    beside = len(closed_loop(site.port, "/free/", "127.0.0.3", 4, 2.0))
    client.join(60)
    served = sum(1 for status, _ in result if status == 200)
    refused = [h for status, h in result if status == 429]
    print(f"\ngunicorn -w 4 (sync): victim req/s alone {alone / 2:.0f}, beside a client "
          f"waiting its turns {beside / 2:.0f}; the client: {served} served in 4 s, "
          f"{len(refused)} refused")
    assert beside >= 0.5 * alone
    assert served >= 3  # it still gets its rate: one a second
    assert refused and all(int(h["retry-after"]) >= 1 for h in refused)


# -- uvicorn: a flood at a global policy with max_wait ---------------------------------------


def test_a_flood_at_a_global_policy_with_max_wait_is_served_at_its_rate(site):
    site.policy(name="paced-global", mode="enforce", algorithm="gcra", limit=5, period=1,
                burst=1, max_wait=2, key="global", path="/async/")
    site.start_asgi()
    seconds = 4.0
    answers: list[tuple[int, dict[str, str]]] = []
    threads = [threading.Thread(target=lambda i=i: answers.extend(
        closed_loop(site.port, "/async/", f"127.0.0.{10 + i}", 1, seconds)))
        for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    served = sum(1 for status, _ in answers if status == 200)
    print(f"\nuvicorn, 16 clients flooding a global 5/s policy with max_wait 2 s: "
          f"{served / seconds:.1f} served/s, {len(answers) - served} refused")
    assert served >= 0.8 * 5 * seconds
