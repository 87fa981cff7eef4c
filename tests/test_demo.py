"""The demo site, driven as `make demo` drives it: migrate, seed, log in, hit the views.

Each step runs in a subprocess with the demo's own settings and a throwaway SQLite file,
so this checks the real entry points (manage.py and the demo commands), not a copy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
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
    assert count.stdout.strip().splitlines()[-1] == "3"


def test_demo_admin_prints_a_working_login(demo_env):
    out = run(["manage.py", "demo_admin", "--password", "s3cret-demo"], demo_env)
    assert out.returncode == 0, out.stderr
    assert "user: admin  password: s3cret-demo" in out.stdout
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
