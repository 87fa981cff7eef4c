"""A concurrency policy under load on real servers (gunicorn gthread, uvicorn) while a real
redis-server is paused for 3 s (SIGSTOP) and resumed (SIGCONT): the policy serves again
within `BREAKER_COOLDOWN` plus the watchdog's `RETRY_EVERY` of the store answering, not
a `period` later.

Decisions sent while the server is paused time out, and the server runs them as it
resumes: each takes a slot whose token only the worker that sent it knows. The policy
fails closed (`on_error="deny"`), so every request it admits was admitted by the store.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import redis

from ratelimits.engine.keynames import base_key
from ratelimits.engine.types import Limit
from ratelimits.pipeline.watchdog import RETRY_EVERY
from tests.settings import RATELIMITS
from tests.support.workers import Site

pytestmark = pytest.mark.slow

LIMIT = 3
CLIENTS = 6
PERIOD = 30
PAUSE = 3.0
#: The site's breaker: after its first failure, one call tries the store every 0.5 s.
BREAKER = {"BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 0.5}


class Load:
    """`CLIENTS` closed-loop clients: (sent, answered, status) of each request. A client
    refused (429, or 503 during the outage) waits a little before its next request, so
    that the load does not take the cores from the servers."""

    def __init__(self, site: Site, path: str) -> None:
        self.site, self.path = site, path
        self.answers: list[tuple[float, float, int]] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _client(self) -> None:
        while not self.stopping.is_set():
            sent = time.monotonic()
            status, _, _ = self.site.send("GET", self.path)
            self.answers.append((sent, time.monotonic(), status))
            if status != 200:
                time.sleep(0.02)

    def stop(self) -> list[tuple[float, float, int]]:
        self.stopping.set()
        for thread in self.threads:
            thread.join(15)
        return sorted(self.answers)


@pytest.mark.parametrize("kind", ["gthread", "uvicorn"])
def test_a_pause_of_the_store_leaves_no_slot_held_past_the_cooldown(
    tmp_path, private_redis, kind
):
    site = Site(tmp_path, private_redis.url)
    site.env["WORKERS_RATELIMITS"] = json.dumps(BREAKER)
    slots = Limit("global", "concurrency", LIMIT, PERIOD, name="slots")
    held = redis.Redis.from_url(private_redis.url)
    try:
        path = "/abusy/" if kind == "uvicorn" else "/busy/"
        site.policy(name=slots.name, mode="enforce", algorithm="concurrency", limit=LIMIT,
                    period=PERIOD, key="global", path=path, on_error="deny")
        if kind == "uvicorn":
            site.start_asgi()
        else:
            site.start(2, threads=4)
        load = Load(site, path)
        deadline = time.monotonic() + 30
        while not any(status == 200 for _, _, status in load.answers):
            assert time.monotonic() < deadline, "never served before the pause"
            time.sleep(0.05)
        time.sleep(0.5)  # every worker's snapshot and scripts loaded: slots taken and freed
        private_redis.proc.send_signal(signal.SIGSTOP)  # accepts, never answers
        time.sleep(PAUSE)
        private_redis.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        bound = BREAKER["BREAKER_COOLDOWN"] + RETRY_EVERY
        time.sleep(bound + 3.0)  # and longer, to see it serve
        answers = load.stop()
        # every request answered: a slot still held is one the outage left behind (a
        # release made as the last responses went out gets the time a retry would)
        key = base_key(RATELIMITS["KEY_PREFIX"], slots)
        settled = time.monotonic() + RETRY_EVERY
        while (left := held.zcard(key)) and time.monotonic() < settled:
            time.sleep(0.02)
    finally:
        site.stop()
        held.close()
    statuses = {status for _, _, status in answers}
    assert statuses <= {200, 429, 503}, statuses
    served = [sent for sent, _, status in answers if status == 200 and sent >= resumed]
    # the first request sent after the resumption that the store admitted (the slots
    # the outage left behind free again); and the policy goes on serving after it
    waited = served[0] - resumed if served else float("inf")
    print(f"\n{kind}: first admitted {waited:.2f} s after the store resumed, bound "
          f"{bound:.2f} s; {left} slots held at the end")
    assert waited <= bound, (waited, bound, left)
    assert len(served) >= 2 * CLIENTS
    assert left == 0
