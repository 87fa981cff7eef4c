"""`ratelimits status` beside real gunicorn workers: its figures count the requests the
workers have just answered, though each worker sends its counts to the store up to a
second after it counted them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.workers import ROOT, Site

#: A process of the site, set up once, that runs `status --json` each time it reads a line
#: and prints the policy's admitted count: the command starts at once, not after the
#: second a new process takes to import Django, which would hide the lag.
_OPERATOR = """
import django; django.setup()
import io, json, sys
from django.core.management import call_command

def admitted(*args):
    out = io.StringIO()
    call_command("ratelimits", "status", "--json", *args, stdout=out)
    (policy,) = [p for p in json.loads(out.getvalue())["policies"] if p["name"] == "hello"]
    return policy["last_hour"]["admitted"]

admitted("--no-wait")  # connections and imports made before the test's traffic
print("ready", flush=True)
for line in sys.stdin:
    print(admitted(*line.split()), flush=True)
"""


@pytest.fixture
def site(tmp_path, private_redis):
    site = Site(tmp_path, private_redis.url, probe=None)
    site.policy(name="hello", mode="enforce", algorithm="fixed_window", limit=100,
                period=600, path="/free/")
    site.start(3)
    operator = subprocess.Popen([sys.executable, "-c", _OPERATOR], cwd=ROOT, env=site.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert operator.stdout.readline() == "ready\n"
    try:
        yield site, operator
    finally:
        operator.stdin.close()
        operator.wait(30)
        site.stop()


def ask(operator: subprocess.Popen[str], *args: str) -> int:
    operator.stdin.write(" ".join(args) + "\n")
    operator.stdin.flush()
    return int(operator.stdout.readline())


def test_status_counts_the_requests_answered_before_it_started(site):
    site, operator = site
    statuses = [site.get("/free/")[0] for _ in range(6)]
    assert statuses == [200] * 6
    began = time.monotonic()
    assert ask(operator) == 6  # every request the workers answered, at once
    assert time.monotonic() - began < 10
    more = [site.get("/free/")[0] for _ in range(6)]
    assert more == [200] * 6
    # --no-wait reads at once: the last second's requests may not be there yet
    assert 6 <= ask(operator, "--no-wait") <= 12
    assert ask(operator) == 12


def test_the_wait_is_said_in_the_help():
    out = subprocess.run([sys.executable, "manage.py", "ratelimits", "status", "--help"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "--no-wait" in out and "1.5 s" in json.dumps(out)
