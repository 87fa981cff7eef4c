"""A DRF site on the compat throttles, deployed as users deploy it: its policies are rows
from `migrate` on, and workers that start without them (rows deleted) and serve their
first requests all at once write them without an error and admit exactly the limit.

`tests.servers.drf_site`: DEFAULT_THROTTLE_CLASSES anon 5/min and user 8/min, a view
scoped "uploads" 3/min, one scoped "reports" through its route's arguments, and a
function view with its own UserRateThrottle.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.support.workers import ROOT, Site

pytestmark = pytest.mark.slow

SETTINGS = "tests.servers.drf_site.settings"
#: The site behind a slow policy table (see its module).
SLOW_WSGI = "tests.servers.drf_site.wsgi"
WORKERS = 3
POLICIES = {"drf:anon": (5, 60), "drf:user": (8, 60), "drf:uploads": (3, 60),
            "drf:reports": (2, 3600)}


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, settings=SETTINGS, probe=None)
    yield site
    site.stop()


def command(site: Site, *args: str) -> str:
    """`manage.py <args>` in a process of the site: its output."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, django; django.setup()\n"
         "from django.core.management import call_command\n"
         f"call_command(*{list(args)!r})"],
        cwd=ROOT, env=site.env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_migrate_writes_the_compat_throttles_policies(site):
    # Site() ran `migrate`, and nothing else: no request was served
    status = command(site, "ratelimits", "status")
    for name in POLICIES:
        assert name in status, status
    assert "No policies" not in status
    site.run(
        "from ratelimits.models import Policy\n"
        "rows = {p.name: (p.declared, p.mode, p.algorithm, p.limit, p.period)"
        " for p in Policy.objects.all()}\n"
        f"want = {{n: (True, 'enforce', 'sliding_log', *r) for n, r in {POLICIES!r}.items()}}\n"
        "assert rows == want, rows\n"
    )


def burst(site: Site, path: str, n: int) -> list[int]:
    """`n` requests released at once, each on its own connection: their statuses."""
    gate = threading.Barrier(n)

    def one(_: int) -> int:
        gate.wait()
        return site.send("GET", path)[0]

    with ThreadPoolExecutor(n) as pool:
        return sorted(pool.map(one, range(n)))


def every_worker_up(site: Site) -> None:
    """Return once each worker has answered (on a view without a throttle): the burst
    then reaches every worker's first throttled request at the same moment."""
    seen: set[str] = set()
    for _ in range(200):
        with ThreadPoolExecutor(2 * WORKERS) as pool:
            seen |= set(pool.map(lambda _: site.send("GET", "/pid/")[2], range(2 * WORKERS)))
        if len(seen) == WORKERS:
            return
    raise RuntimeError(f"only workers {seen} answered")


def test_fresh_workers_write_the_rows_at_once_without_an_error_and_admit_exactly(
    site, private_redis
):
    store = redis.Redis.from_url(private_redis.url)
    # each read of the policy rows takes 0.3 s: every worker reads before any writes
    site.env["SLOW_POLICY_READS"] = "0.3"
    for trial in range(3):
        # a deploy whose `migrate` wrote no rows: each worker writes them at its first
        # throttled request, and all of them get theirs at the same moment
        site.run("from ratelimits.models import Policy\n"
                 "Policy.objects.filter(declared=True).delete()")
        store.flushall()
        site.start(WORKERS, 1, SLOW_WSGI)
        every_worker_up(site)
        statuses = burst(site, "/api/ping/", 10)
        site.stop()
        errors = site.errors()
        assert "UNIQUE" not in errors and "could not write" not in errors, (trial, errors)
        assert "Traceback" not in errors, (trial, errors)
        assert statuses == [200] * 5 + [429] * 5, (trial, statuses)
        site.run(
            "from ratelimits.models import Policy\n"
            "names = sorted(Policy.objects.values_list('name', flat=True))\n"
            "assert names == ['drf:anon', 'drf:user'], names\n"
        )
    store.close()
