"""The demo site, driven as `make demo` drives it: migrate, seed, log in, hit the views.

Each step runs in a subprocess with the demo's own settings and a throwaway SQLite file,
so this checks the real entry points (manage.py and the demo commands), not a copy.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(args, env, **kwargs):
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )


@pytest.fixture
def demo_env(tmp_path, redis_url):
    env = {
        **os.environ,
        "DEMO_DB": str(tmp_path / "demo.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
    }
    env.pop("REDIS_URL", None)  # the demo's default: the in-process engine
    migrated = run(["manage.py", "migrate", "--noinput"], env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def test_seed_creates_the_example_policies_and_is_idempotent(demo_env):
    first = run(["manage.py", "seed_policies"], demo_env)
    assert first.returncode == 0, first.stderr
    assert "created enforce  hello-per-ip" in first.stdout
    assert "created shadow   search-shadow" in first.stdout
    assert "created enforce  search-rollout" in first.stdout
    assert "created enforce  report-paced" in first.stdout
    assert "created enforce  busy-adaptive" in first.stdout
    assert "created override hello-per-ip ip:10.0.0.0/8" in first.stdout
    again = run(["manage.py", "seed_policies"], demo_env)
    assert again.returncode == 0, again.stderr
    assert "updated" in again.stdout and "created" not in again.stdout
    count = run(
        [
            "manage.py",
            "shell",
            "-c",
            "from ratelimits.models import Policy; print(Policy.objects.count())",
        ],
        demo_env,
    )
    assert count.stdout.strip().splitlines()[-1] == "7"  # and "quote", declared in code


def test_demo_admin_prints_a_working_login(demo_env):
    out = run(["manage.py", "demo_admin", "--password", "s3cret-demo"], demo_env)
    assert out.returncode == 0, out.stderr
    assert "Admin: http://127.0.0.1:8000/admin/  user: admin  password: s3cret-demo" in out.stdout
    check = run(
        [
            "manage.py",
            "shell",
            "-c",
            textwrap.dedent("""
        from django.contrib.auth import authenticate
        print(bool(authenticate(username='admin', password='s3cret-demo')))
    """),
        ],
        demo_env,
    )
    assert check.stdout.strip().splitlines()[-1] == "True", check.stderr


def test_demo_views_show_enforce_shadow_and_drf_scope(demo_env):
    assert run(["manage.py", "seed_policies"], demo_env).returncode == 0
    script = textwrap.dedent("""
        import django
        django.setup()
        from django.test import Client
        c = Client()
        print("hello", [c.get("/hello/").status_code for _ in range(6)])
        print("search", [c.get("/search/?q=x").status_code for _ in range(5)])
        print("items", [c.get("/api/items/").status_code for _ in range(6)])
        r = c.get("/hello/")
        print("retry", r.headers.get("Retry-After"), "ratelimit" in {k.lower() for k in r.headers})
        print("slow", c.get("/slow/").status_code)
        print("quote", [c.get("/quote/").status_code for _ in range(4)])
        r = [c.get("/report/") for _ in range(2)]
        print("report", [x.status_code for x in r], r[1].headers.get("Retry-After"))
        from ratelimits.models import Policy
        print("declared", list(Policy.objects.filter(declared=True).values_list("name", "mode")))
    """)
    out = run(["-c", script], {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["hello"] == "[200, 200, 200, 200, 200, 429]"
    assert lines["search"] == "[200, 200, 200, 200, 200]"  # shadow: nothing refused
    assert "would" in out.stderr.lower() and "search-shadow" in out.stderr  # ...but logged
    assert lines["items"] == "[200, 200, 200, 200, 200, 429]"
    retry, has_header = lines["retry"].split()
    assert int(retry) >= 1 and has_header == "True"
    assert lines["slow"] == "200"
    assert lines["quote"] == "[200, 200, 200, 429]"
    # cold: the next turn is 3 s away, 1 s beyond the wait, so the second is refused
    assert lines["report"] == "[200, 429] 1"
    assert lines["declared"] == "[('quote', 'enforce')]"


def test_demo_admin_prints_the_url_of_the_port_it_is_given(demo_env):
    out = run(["manage.py", "demo_admin", "--port", "8123", "--password", "pw"], demo_env)
    assert out.returncode == 0, out.stderr
    assert "Admin: http://127.0.0.1:8123/admin/  user: admin" in out.stdout


def test_shadow_log_line_is_the_one_the_readme_shows(demo_env):
    assert run(["manage.py", "seed_policies"], demo_env).returncode == 0
    script = textwrap.dedent("""
        import django
        django.setup()
        from django.test import Client
        c = Client()
        for _ in range(4):
            c.get("/search/?q=x")
    """)
    out = run(["-c", script], {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"`(ratelimits: shadow policy search-shadow would reject [^`]*)`", readme)
    assert shown, "the README shows no shadow log line of the demo"
    for line in shown:
        # The README's retry time must be one the 10-second policy can give.
        retry = re.search(r"retry after ([0-9.]+)s", line)
        assert retry is not None and 0 < float(retry.group(1)) <= 10, line
        pattern = re.escape(line).replace(re.escape(retry.group(1)), r"[0-9.]+")
        assert re.search(r"WARNING " + pattern + "$", out.stderr, re.M), (line, out.stderr)
    assert "ratelimits: ratelimits:" not in out.stderr  # the prefix appears once


def test_the_demo_page_claims_no_limit_that_no_policy_sets(demo_env):
    assert run(["manage.py", "seed_policies"], demo_env).returncode == 0
    script = textwrap.dedent("""
        import django
        django.setup()
        from django.test import Client
        c = Client()
        print("page", " ".join(c.get("/").content.decode().split()))
        slow = [c.get("/slow/") for _ in range(10)]
        print("slow", {r.status_code for r in slow}, any("RateLimit" in r for r in slow))
        print("busy", c.get("/busy/").status_code)
    """)
    out = run(["-c", script], {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["slow"] == "{200} False"  # no seeded policy matches /slow/...
    slow_item = lines["page"].split('href="/slow/"', 1)[1].split("</li>", 1)[0]
    assert "No policy matches it" in slow_item  # ...and the page says so
    assert "limited" not in slow_item
    assert "http://testserver/hello/" in lines["page"]  # the shell example uses the real host
    assert lines["busy"] == "200"  # alone, always within the learnt limit
    busy_item = lines["page"].split('href="/busy/"', 1)[1].split("</li>", 1)[0]
    assert "busy-adaptive" in busy_item


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow  # starts `make demo`: runserver and its reloader
def test_make_demo_serves_on_the_port_it_is_given(tmp_path):
    port = free_port()
    env = {**os.environ, "DEMO_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("REDIS_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = tmp_path / "make-demo.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            ["make", "--no-print-directory", "demo", f"PORT={port}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: make, runserver and its reloader
        )
    try:
        # Wait for the server to come up (a start-up, not a rate-limit window).
        deadline = time.monotonic() + 90
        while True:
            try:
                first = get_status(f"http://127.0.0.1:{port}/hello/")
                break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        rest = [get_status(f"http://127.0.0.1:{port}/hello/") for _ in range(5)]
        assert [first, *rest] == [200] * 5 + [429]
        assert f"Admin: http://127.0.0.1:{port}/admin/" in log.read_text()
        assert get_status(f"http://127.0.0.1:{port}/admin/login/") == 200
        # 20 clients at once on /busy/: the adaptive policy, starting at its floor of
        # 1, lets few run and answers the others 503 at once instead of queueing them
        with ThreadPoolExecutor(20) as pool:
            busy = list(pool.map(lambda _: get_status(f"http://127.0.0.1:{port}/busy/"),
                                 range(20)))
        assert set(busy) == {200, 503} and busy.count(503) >= 10, busy
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_make_honours_chromium_from_the_environment():
    def dry_run(chromium: str) -> str:
        env = {**os.environ, "CHROMIUM": chromium}
        out = subprocess.run(
            ["make", "-n", "--no-print-directory", "test"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return out.stdout + out.stderr

    # A binary that does not exist is the target make would install, so it was read...
    assert "apt-get install" in dry_run("/nonexistent/chromium")
    # ...and one that exists is used as it is.
    assert "apt-get install" not in dry_run(sys.executable)


def test_the_rollout_the_readme_describes_takes_127_0_0_1_in_at_50_percent():
    """The quick start says 127.0.0.1 is out of search-rollout at 25% and in at 50%."""
    from demo_project.demo.seed import EXAMPLE_POLICIES
    from ratelimits.pipeline.resolver import in_rollout

    (seeded,) = [p for p in EXAMPLE_POLICIES if p["name"] == "search-rollout"]
    assert seeded["rollout"] == 25
    assert not in_rollout("search-rollout", "ip:127.0.0.1", 25)
    assert in_rollout("search-rollout", "ip:127.0.0.1", 50)
    assert "at 50% your address is in" in (ROOT / "README.md").read_text()
