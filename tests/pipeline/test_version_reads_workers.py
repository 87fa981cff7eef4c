"""1,000 requests no policy matches, on three gunicorn workers: at most one version read
per second per worker, and an edit still reaches every worker within a second."""

from __future__ import annotations

import time

import pytest
import redis

from tests.support.workers import Site

pytestmark = pytest.mark.slow

WORKERS = 3


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url)
    yield site
    site.stop()


def gets(server: redis.Redis) -> int:
    return int(server.info("commandstats").get("cmdstat_get", {}).get("calls", 0))


def test_unmatched_requests_read_once_a_second_and_edits_arrive(site, private_redis):
    site.start(workers=WORKERS)
    server = redis.Redis.from_url(private_redis.url)
    before = gets(server)
    started = time.monotonic()
    answers = site.load("/hello/", 1000)
    elapsed = time.monotonic() - started
    assert {status for _, status, _ in answers} == {200}
    reads = gets(server) - before
    assert reads <= WORKERS * (elapsed + 1), (reads, elapsed)
    workers = {pid for _, _, pid in answers}

    # an operator saves a policy for that path elsewhere (the version is bumped on commit)
    site.policy(name="late", mode="enforce", algorithm="fixed_window", limit=1,
                period=3600, key="global", path="/hello/")
    saved = time.monotonic()
    answers = []
    while time.monotonic() < saved + 2.0:
        answers += site.load("/hello/", 30)
    late = [(status, pid) for sent, status, pid in answers if sent > saved + 1.0]
    assert {pid for _, pid in late} == workers  # every worker answered after the second
    assert sum(status == 200 for status, _ in late) == 0, late  # and every one enforced
