"""An operator relents, or not: three gunicorn sync workers obey the admin's switch within
half a second, refused clients included, on Redis and on PostgreSQL; and an operator's
reset of the client.

A client is refused by an enforced policy until every worker answers it from the refusal
it remembers; the operator switches the policy to shadow with the admin's action (its own
code, in a process of the site, as an operator's click runs it); then every worker
answers the client 200 within 0.5 s of the action's return, and goes on doing so. The
other way, switched back to enforce, every worker refuses the client within 0.5 s; and
so on, a few rounds. The same on a site whose only store is PostgreSQL.
Requests come from several clients at once, so that every worker answers some; each
answer names its worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from ratelimits.engine.scripts import batch_library
from tests.redis_server import Monitor
from tests.support.workers import Site

pytestmark = pytest.mark.slow

WORKERS = 3
#: What the docs promise: a change reaches every process within this (seconds).
BOUND = 0.5
#: Switches each way: a worker that does not hear a change still learns it within a
#: second (its refusal remembered for a second at most, the version read once a second),
#: so it may fall within the bound by chance, each time at a moment of its own; all three
#: workers in every round, hardly ever.
ROUNDS = 3
NAME = "relent"

SWITCH = """
import time
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.fallback import FallbackStorage
from django.test import RequestFactory
from ratelimits.models import Policy

request = RequestFactory().post("/admin/ratelimits/policy/")
request.user = get_user_model().objects.get(username="operator")
request.session = {{}}
request._messages = FallbackStorage(request)
policies = admin.site._registry[Policy]
policies.{action}(request, Policy.objects.filter(name={name!r}))
done = time.time()
assert Policy.objects.get(name={name!r}).mode == {mode!r}
open({stamp!r}, "w").write(repr(done))
"""


RESET = """
import time
from ratelimits.models import Policy
from ratelimits.ops.reset import reset_client

policy = Policy.objects.get(name={name!r})
before = time.time()
reset_client(policy, "127.0.0.1")
open({stamp!r}, "w").write(repr((before, time.time())))
"""
BATCH, LIBRARY = batch_library()


@pytest.fixture
def store() -> str:
    """The store of the site's limits (a test parametrizes it)."""
    return "redis"


@pytest.fixture
def site(tmp_path, store, request, monkeypatch):
    if store == "postgres":  # the site's database holds its limits too
        monkeypatch.setenv("WORKERS_POSTGRES_URL", request.getfixturevalue("site_database"))
        site = Site(tmp_path, "", settings="tests.support.workers_postgres_settings")
    else:
        url = request.getfixturevalue("private_redis").url
        # loaded before the workers start: a worker's first decision is one call (MONITOR)
        redis.Redis.from_url(url).function_load(LIBRARY)
        site = Site(tmp_path, url)
    site.run("from django.contrib.auth import get_user_model\n"
             "get_user_model().objects.create_superuser('operator', 'op@example.com', 'pw')")
    site.policy(name=NAME, mode="enforce", algorithm="sliding_log", limit=5, period=3600,
                key="ip", path="/hello/")
    site.start(workers=WORKERS)  # it logs each refusal (thousands here), read as it comes
    yield site
    site.stop()


class Traffic:
    """Requests from `clients` threads at once until stopped: (time sent, status, pid)."""

    def __init__(self, site: Site, clients: int = 6) -> None:
        self.site = site
        self.answers: list[tuple[float, int, int]] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._send) for _ in range(clients)]

    def _send(self) -> None:
        while not self.stopping.is_set():
            sent = time.time()
            status, pid = self.site.get("/hello/")
            self.answers.append((sent, status, pid))
            time.sleep(0.002)

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def until(self, done: Callable[[list[tuple[float, int, int]]], bool],
              timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not done(list(self.answers)):
            assert time.monotonic() < deadline, _summary(self.answers)
            time.sleep(0.02)


def _summary(answers: list[tuple[float, int, int]]) -> str:
    return f"{len(answers)} answers, the last: {answers[-12:]}"


def _switch(site: Site, tmp_path: Path, action: str, mode: str) -> float:
    """Run the admin's action on the policy in a process of the site; the time it
    returned (the change committed, and published)."""
    stamp = tmp_path / f"{action}.stamp"
    site.run(SWITCH.format(action=action, name=NAME, mode=mode, stamp=str(stamp)))
    return float(stamp.read_text())


def _every_worker_after(answers: list[tuple[float, int, int]], since: float, status: int,
                        workers: set[int]) -> bool:
    """Whether each of `workers` answered `status` to a request sent after `since`."""
    return {pid for sent, got, pid in answers if sent > since and got == status} >= workers


def _measure(answers: list[tuple[float, int, int]], since: float, old: int,
             workers: set[int]) -> dict[int, float]:
    """Per worker: how long after `since` it last answered `old` (0: never after it)."""
    return {pid: max([sent - since for sent, got, p in answers
                      if p == pid and got == old and sent > since], default=0.0)
            for pid in workers}


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_switches_reach_every_worker_within_half_a_second(site, tmp_path, capsys):
    with Traffic(site) as traffic:
        # refused everywhere, from memory by now: five admitted, then 429 from each worker
        traffic.until(lambda a: len({pid for _, got, pid in a if got == 429}) == WORKERS
                      and len(a) > 100)
        answers = list(traffic.answers)
        assert sum(got == 200 for _, got, _ in answers) == 5
        workers = {pid for _, _, pid in answers}
        assert len(workers) == WORKERS

        late_429: list[float] = []
        late_200: list[float] = []
        for _ in range(ROUNDS):
            relented = _switch(site, tmp_path, "switch_to_shadow", "shadow")
            # every worker answers 200 after the switch, and refuses nothing past the bound
            traffic.until(lambda a, t=relented: _every_worker_after(a, t + BOUND, 200, workers))
            late_429 += _measure(list(traffic.answers), relented, 429, workers).values()

            # refused again by every worker (from memory, once the store refused it)
            enforced = _switch(site, tmp_path, "switch_to_enforce", "enforce")
            traffic.until(lambda a, t=enforced: _every_worker_after(a, t + BOUND, 429, workers))
            late_200 += _measure(list(traffic.answers), enforced, 200, workers).values()

    with capsys.disabled():
        print(f"\nswitch to shadow: last 429 per worker and round "
              f"{sorted(round(s * 1000) for s in late_429)} ms after the action; "
              f"switch to enforce: last 200 "
              f"{sorted(round(s * 1000) for s in late_200)} ms after it")
    assert max(late_429) < BOUND, late_429
    assert max(late_200) < BOUND, late_200


def test_a_reset_sends_every_worker_to_the_store_at_once(site, tmp_path, private_redis,
                                                          capsys):
    """The admin's "reset this client" (and `ratelimits reset`): every worker stops
    answering the client from the refusal it remembers and asks the store, within
    milliseconds; before, each did when its memory ran out (up to a second later, at a
    moment of its own). A worker asking is its decision script in the store's MONITOR."""
    client = redis.Redis.from_url(private_redis.url)
    with Traffic(site) as traffic:
        traffic.until(lambda a: len({pid for _, got, pid in a if got == 429}) == WORKERS
                      and len(a) > 100)
        workers = {pid for _, _, pid in traffic.answers}
        monitor = Monitor(private_redis.port, tmp_path / "monitor.txt")
        stamp = tmp_path / "reset.stamp"
        site.run(RESET.format(name=NAME, stamp=str(stamp)))
        before, reset_at = eval(stamp.read_text())
        time.sleep(1.0)
    names = monitor.names(client)
    asked: dict[int, float] = {}
    for at, who in monitor.scripts(BATCH, since=before):
        if who in names and names[who].startswith("worker-"):
            asked.setdefault(int(names[who].removeprefix("worker-")), at - reset_at)
    with capsys.disabled():
        print(f"\nreset: each worker asked the store "
              f"{sorted(round(s * 1000) for s in asked.values())} ms after it")
    assert set(asked) == workers, (asked, workers)
    # the bound the docs promise ("within half a second"): measured a few ms, 264 ms on
    # a loaded CI; a worker waiting on its own memory instead (up to a second, at a
    # moment of its own) puts all three within it by chance about one run in eight
    assert max(asked.values()) < 0.5, asked
    client.close()
