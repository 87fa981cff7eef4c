"""The demo site, driven as `make demo` drives it: migrate, seed, log in, hit the views.

Each step runs in a subprocess with the demo's own settings and a throwaway SQLite file,
so this checks the real entry points (manage.py and the demo commands), not a copy. The
file runs `manage.py migrate` once and gives each test a copy of the migrated database.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
from django.test import override_settings

ROOT = Path(__file__).resolve().parent.parent
#: The tour of the demo, step by step (what the README's quick start used to say).
PAGE = ROOT / "docs" / "demo.md"


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


def _env(database: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DEMO_DB": str(database),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
    }
    env.pop("REDIS_URL", None)  # the demo's default: the in-process engine
    return env


@pytest.fixture(scope="module")
def migrated_database(tmp_path_factory):
    """The demo's database as `manage.py migrate` leaves it, made once for this file."""
    database = tmp_path_factory.mktemp("demo") / "migrated.sqlite3"
    migrated = run(["manage.py", "migrate", "--noinput"], _env(database))
    assert migrated.returncode == 0, migrated.stderr
    return database


@pytest.fixture
def demo_env(tmp_path, redis_url, migrated_database):
    """The demo's settings on a freshly migrated database of this test's own."""
    database = tmp_path / "demo.sqlite3"
    shutil.copyfile(migrated_database, database)
    return _env(database)


def test_seed_creates_the_example_policies_and_is_idempotent(demo_env):
    first = run(["manage.py", "seed_policies"], demo_env)
    assert first.returncode == 0, first.stderr
    assert "created enforce  hello-per-ip" in first.stdout
    assert "created shadow   search-shadow" in first.stdout
    assert "created enforce  shop-rollout" in first.stdout
    assert "created enforce  report-paced" in first.stdout
    assert "created enforce  busy-adaptive" in first.stdout
    assert "created enforce  admin-login-failures" in first.stdout
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
    # and "quote" and "weather-partner", declared in code
    assert count.stdout.strip().splitlines()[-1] == "9"


def test_seeding_again_puts_the_tour_back_where_it_starts(demo_env):
    """What a tour leaves behind (a mode switched, a rollout raised, an override added,
    the retired search-rollout of an earlier demo) is undone; policies of one's own stay."""
    assert run(["manage.py", "seed_policies"], demo_env).returncode == 0
    changed = run(["manage.py", "shell", "-c", textwrap.dedent("""
        from ratelimits.models import Override, Policy
        Policy.objects.filter(name="search-shadow").update(mode="enforce")
        Policy.objects.filter(name="shop-rollout").update(rollout=50)
        hello = Policy.objects.get(name="hello-per-ip")
        Override.objects.create(policy=hello, match="ip:127.0.0.1", exempt=True)
        Policy.objects.create(name="search-rollout", mode="enforce", limit=10, path="/search/")
        Policy.objects.create(name="mine", mode="enforce", limit=2, path="/slow/")
    """)], demo_env)
    assert changed.returncode == 0, changed.stderr
    again = run(["manage.py", "seed_policies"], demo_env)
    assert again.returncode == 0, again.stderr
    assert "removed search-rollout (an example of an earlier demo)" in again.stdout
    assert "removed override hello-per-ip ip:127.0.0.1 (not one of the examples)" in again.stdout
    state = run(["manage.py", "shell", "-c", textwrap.dedent("""
        from ratelimits.models import Override, Policy
        print(sorted(Policy.objects.values_list("name", "mode", "rollout")))
        print(sorted(Override.objects.values_list("match", flat=True)))
    """)], demo_env)
    policies, overrides = state.stdout.strip().splitlines()[-2:]
    assert "('search-shadow', 'shadow', 100)" in policies
    assert "('shop-rollout', 'enforce', 25)" in policies
    assert "search-rollout" not in policies and "('mine', 'enforce', 100)" in policies
    assert overrides == "['ip:10.0.0.0/8', 'ip:192.0.2.10']"


def test_the_page_gives_the_seeders_counts():
    from demo_project.demo.seed import EXAMPLE_OVERRIDES, EXAMPLE_POLICIES

    words = {2: "two", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    page = " ".join(PAGE.read_text().split())
    seeded = f"seeds {words[len(EXAMPLE_POLICIES)]} example policies and " \
             f"{words[len(EXAMPLE_OVERRIDES)]} overrides"
    assert seeded in page
    listed = len(EXAMPLE_POLICIES) + 2  # and the two declared in code
    assert f"shows {words[listed]}: the {words[len(EXAMPLE_POLICIES)]} the seeder made, " \
           "and `quote` and `weather-partner`" in page
    for fields in EXAMPLE_POLICIES:  # every one is introduced, with its path
        assert f"| `{fields['name']}` |" in page
    assert "| `quote` | `/quote/` |" in page
    assert "| `weather-partner` | `/forecast/` |" in page


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
        print("shop", [c.get("/shop/").status_code for _ in range(11)])
        print("items", [c.get("/api/items/").status_code for _ in range(6)])
        r = c.get("/hello/")
        print("retry", r.headers.get("Retry-After"), "ratelimit" in {k.lower() for k in r.headers})
        print("slow", c.get("/slow/").status_code)
        print("quote", [c.get("/quote/").status_code for _ in range(4)])
        r = [c.get("/report/") for _ in range(2)]
        print("report", [x.status_code for x in r], r[1].headers.get("Retry-After"))
        from ratelimits.models import Policy
        print("declared", list(Policy.objects.filter(declared=True).values_list("name", "mode")))
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(10) as pool:  # ten at once: the partner's turns run out
            at_once = list(pool.map(lambda _: Client().get("/forecast/"), range(10)))
        print("forecast", sorted({r.status_code for r in at_once}),
              {r.get("Retry-After") for r in at_once if r.status_code == 503})
    """)
    out = run(["-c", script], {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert lines["hello"] == "[200, 200, 200, 200, 200, 429]"
    assert lines["search"] == "[200, 200, 200, 200, 200]"  # shadow: nothing refused
    assert lines["shop"] == str([200] * 11)  # 127.0.0.1 is not in the rollout's 25%
    assert "would" in out.stderr.lower() and "search-shadow" in out.stderr  # ...but logged
    assert lines["items"] == "[200, 200, 200, 200, 200, 429]"
    retry, has_header = lines["retry"].split()
    assert int(retry) >= 1 and has_header == "True"
    assert lines["slow"] == "200"
    assert lines["quote"] == "[200, 200, 200, 429]"
    # cold: the next turn is 3 s away, 1 s beyond the wait, so the second is refused
    assert lines["report"] == "[200, 429] 1"
    assert lines["declared"] == "[('quote', 'enforce'), ('weather-partner', 'enforce')]"
    assert lines["forecast"] == "[200, 503] {'1'}"


def test_demo_admin_prints_the_url_of_the_port_it_is_given(demo_env):
    out = run(["manage.py", "demo_admin", "--port", "8123", "--password", "pw"], demo_env)
    assert out.returncode == 0, out.stderr
    assert "Admin: http://127.0.0.1:8123/admin/  user: admin" in out.stdout


def test_shadow_log_line_is_the_one_the_page_shows(demo_env):
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
    page = PAGE.read_text()
    shown = re.findall(r"`(ratelimits: shadow policy search-shadow would reject [^`]*)`", page)
    assert shown, "docs/demo.md shows no shadow log line of the demo"
    for line in shown:
        # The page's retry time must be one the 10-second policy can give.
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


def test_the_rollout_the_page_describes_takes_127_0_0_1_in_at_50_percent():
    """The page says 127.0.0.1 is out of shop-rollout at 25% and in at 50%."""
    from demo_project import settings as demo
    from demo_project.demo.seed import EXAMPLE_POLICIES
    from ratelimits.pipeline.compiled import in_rollout

    (seeded,) = [p for p in EXAMPLE_POLICIES if p["name"] == "shop-rollout"]
    assert seeded["rollout"] == 25 and seeded["path"] == "/shop/"
    with override_settings(SECRET_KEY=demo.SECRET_KEY):  # the draw is keyed by it
        assert not in_rollout("shop-rollout", "ip:127.0.0.1", 25)
        assert in_rollout("shop-rollout", "ip:127.0.0.1", 50)
    assert "at 50% your address is in" in " ".join(PAGE.read_text().split())


def test_every_example_policy_has_a_path_of_its_own():
    """So no step of the tour meets another step's policy (the DRF scope's policy
    matches only its scope's views)."""
    from demo_project.demo.seed import EXAMPLE_POLICIES

    paths = [p["path"] for p in EXAMPLE_POLICIES if not p.get("scope")]
    assert len(paths) == len(set(paths)) and "*" not in paths


# -- the tour, step by step, in any order ---------------------------------------------------

#: The steps of docs/demo.md, each as the page tells it (its undo included), run in the
#: order given on the command line, on the app's clock (it starts at the top of a minute;
#: nothing sleeps). `pause=N` first: the seconds a reader takes between two steps.
TOUR = """
import json
import logging
import sys

import django

django.setup()

from django.contrib.auth import get_user_model
from django.test import Client

from ratelimits import runtime
from ratelimits.models import Override, Policy
from ratelimits.ops import observe
from ratelimits.pipeline.resolver import DB_CHECK_EVERY
from ratelimits.testing import Clock

clock = Clock(0)  # the epoch: the top of a minute, of every window here
runtime.use_clock(clock)
lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


logging.getLogger("ratelimits").addHandler(Keep())
admin = Client()
admin.force_login(get_user_model().objects.create_superuser("tour", password="x"))
c = Client()


def act(action, name):  # an action of the admin's list, on one policy
    pk = Policy.objects.get(name=name).pk
    r = admin.post("/admin/ratelimits/policy/", {"action": action, "_selected_action": [pk]})
    assert r.status_code == 302, r.status_code


def codes(path, n):
    return [c.get(path).status_code for _ in range(n)]


def timed(path, n):
    out = []
    for _ in range(n):
        before = clock.now()
        out.append((c.get(path).status_code, round(clock.now() - before, 2)))
    return out


def hello():
    got = codes("/hello/", 6)
    r = c.get("/hello/")
    return got, r.status_code, int(r["Retry-After"]) > 0, r["RateLimit-Policy"]


def shadow():
    got, logged = [], []
    for i in range(1, 6):
        start = len(lines)
        got.append(c.get("/search/?q=tea").status_code)
        if any("shadow policy search-shadow would reject" in m for m in lines[start:]):
            logged.append(i)
    return got, logged


def enforce():
    act("switch_to_enforce", "search-shadow")
    got = codes("/search/?q=tea", 4)
    act("switch_to_shadow", "search-shadow")
    return got


def rollout():
    at25 = codes("/shop/", 11)
    counted = observe.last_hour(["shop-rollout"], now=clock.now())["shop-rollout"]
    act("raise_rollout", "shop-rollout")
    same_minute = codes("/shop/", 1)
    clock.advance(60 - clock.now() % 60)  # a minute of its own
    at50 = codes("/shop/", 11)
    policy = Policy.objects.get(name="shop-rollout")
    policy.rollout = 25  # put back, as on the policy's page
    policy.save()
    return at25, counted.would_reject, same_minute, at50


def items():
    return codes("/api/items/", 6)


def quote():
    refused = codes("/quote/", 4)
    clock.advance(10)
    act("switch_to_shadow", "quote")
    shadowed = codes("/quote/", 4)
    act("switch_to_enforce", "quote")
    return refused, shadowed


def overrides():
    policy = Policy.objects.get(name="hello-per-ip")
    added = Override.objects.create(policy=policy, match="ip:127.0.0.1", exempt=True)
    got = [(r.status_code, r.has_header("RateLimit")) for r in (c.get("/hello/")
                                                              for _ in range(7))]
    added.delete()
    return got


def report():
    first, second = c.get("/report/"), c.get("/report/")
    clock.advance(1)
    later = timed("/report/", 1)
    steady = []
    for _ in range(10):
        clock.advance(1)
        steady += timed("/report/", 1)
    burst = timed("/report/", 6)
    clock.advance(10)
    cold = codes("/report/", 2)
    return first.status_code, second.status_code, second["Retry-After"], later, \\
        [code for code, _ in steady], steady[-1], burst, cold


def forecast():
    paced = timed("/forecast/?city=Oslo", 5)
    act("switch_to_shadow", "weather-partner")
    unpaced = timed("/forecast/?city=Oslo", 4)
    watched = observe.last_hour(["weather-partner"], now=clock.now())["weather-partner"]
    act("switch_to_enforce", "weather-partner")
    return paced, unpaced, watched.would_reject


def login():
    def attempt(password):
        r = Client().post("/admin/login/", {"username": "tour", "password": password})
        return r.status_code, r.get("Retry-After")

    right = attempt("x")
    wrong = [attempt("guess")[0] for _ in range(3)]
    locked = [attempt("guess"), attempt("x")]
    clock.advance(120)
    return right, wrong, locked, attempt("x")


def shell():
    assert codes("/slow/", 1) == [200]  # the server has just looked at its tables
    # saved by another process (manage.py shell): no signal reaches this one
    Policy.objects.bulk_create([Policy(name="slow-per-ip", mode="enforce",
                                       algorithm="sliding_log", limit=2, period=60,
                                       key="ip", path="/slow/")])
    clock.advance(DB_CHECK_EVERY)
    after = codes("/slow/", 3)
    Policy.objects.filter(name="slow-per-ip").delete()
    return after


STEPS = {f.__name__: f for f in (hello, shadow, enforce, rollout, items, quote, overrides,
                                 report, forecast, login, shell)}
pause, *order = sys.argv[1:]
results = {}
for name in order:
    results[name] = STEPS[name]()
    clock.advance(float(pause.removeprefix("pause=")))
print(json.dumps(results))
"""

#: What each step shows, as the page says it (JSON: lists for tuples).
TOUR_SAYS = {
    # five 200, then 429; the next refusal has Retry-After and the policy's headers
    "hello": [[200, 200, 200, 200, 200, 429], 429, True, '"hello-per-ip";q=5;w=60'],
    # every search passes; the fourth and the fifth are logged
    "shadow": [[200] * 5, [4, 5]],
    # enforced: three 200, then 429
    "enforce": [200, 200, 200, 429],
    # 25%: eleven 200, the eleventh counted as a would-be refusal; 50%: a 429 in the same
    # minute, and in a minute of its own ten 200, then 429
    "rollout": [[200] * 11, 1, [429], [200] * 10 + [429]],
    "items": [200, 200, 200, 200, 200, 429],
    # the fourth in 10 s refused; in shadow, none
    "quote": [[200, 200, 200, 429], [200] * 4],
    # exempt: seven 200 without a RateLimit header
    "overrides": [[200, False]] * 7,
    # cold: 429 with Retry-After 1; a second later served after a 2-s wait; steady
    # reloads all served, the last at once; a burst then: four at once, the next ones
    # after a second's wait each; ten idle seconds: cold again
    "report": [200, 429, "1", [[200, 2.0]], [200] * 10, [200, 0.0],
               [[200, 0.0]] * 4 + [[200, 1.0]] * 2, [200, 429]],
    # two calls to the partner at once, then one each half second, all served; in shadow
    # none waits, and the admin counts the calls it would have made wait
    "forecast": [[[200, 0.0], [200, 0.0], [200, 0.5], [200, 0.5], [200, 0.5]],
                 [[200, 0.0]] * 4, 4],
    # a right password gets in (302); three wrong ones get the form again (200); the
    # fourth attempt, and the right password then, 429 for the 2-minute lockout; after
    # it, the right password gets in
    "login": [[302, None], [200, 200, 200], [[429, "120"], [429, "120"]], [302, None]],
    # saved by another process: two 200, then 429, DB_CHECK_EVERY after the save
    "shell": [200, 200, 429],
}
PAGE_ORDER = ["hello", "shadow", "enforce", "rollout", "items", "quote", "overrides",
              "report", "forecast", "login", "shell"]


def tour(demo_env, *order, pause=120):
    assert run(["manage.py", "seed_policies"], demo_env).returncode == 0
    out = run(["-c", TOUR, f"pause={pause}", *order],
              {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", [
    PAGE_ORDER,
    ["login", "enforce", "rollout", "shell", "forecast", "report", "overrides", "quote",
     "items", "shadow", "hello"],
    ["overrides", "hello", "rollout", "enforce", "quote", "shadow", "report", "items",
     "shell", "login", "forecast"],
], ids=["as-the-page-goes", "enforce-first", "overrides-first"])
def test_each_step_of_the_tour_shows_what_the_page_says_in_any_order(demo_env, order):
    """A reader's pause of two minutes between steps: every window here is a minute or
    less (the sliding window of hello-per-ip weighs the minute before too)."""
    assert tour(demo_env, *order) == {name: TOUR_SAYS[name] for name in order}


def test_enforcing_search_shadow_leaves_the_rollout_step_as_the_page_says(demo_env):
    """The newcomer's order, with no pause at all: "Switch to enforce" on search-shadow,
    then the rollout, whose 429 comes where the page says (it has /shop/ to itself)."""
    assert tour(demo_env, "enforce", "rollout", pause=0) == {
        "enforce": TOUR_SAYS["enforce"], "rollout": TOUR_SAYS["rollout"]}
    page = " ".join(PAGE.read_text().split())
    assert "prints eleven `200`" in page
    assert "a request in the same minute gets a `429` at once" in page
    assert "the same loop prints ten `200`, then `429`" in page


# -- what the demo needs --------------------------------------------------------------------

#: Every page of the demo, its commands and its admin, with whatever is not installed
#: by `pip install -e '.[demo]'` made impossible to import.
NEEDS = """
import importlib.abc
import importlib.metadata as md
import json
import re
import sys

allowed = set(json.loads(sys.argv[1]))
canonical = lambda name: re.sub(r"[-_.]+", "-", name).lower()
owners = md.packages_distributions()
refused = set()


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        dists = {canonical(d) for d in owners.get(name.split(".")[0], ())}
        if dists and not dists & allowed:
            refused.add(name.split(".")[0])
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocked())

import django

django.setup()
from django.core.management import call_command
from django.test import Client

call_command("check")
call_command("seed_policies", verbosity=0)
call_command("demo_admin", password="pw")
call_command("ratelimits", "status")
c = Client()
assert c.login(username="admin", password="pw")
for path in ("/", "/hello/", "/search/", "/shop/", "/api/items/", "/quote/", "/report/",
             "/forecast/",
             "/slow/", "/busy/", "/ratelimits/metrics/", "/admin/",
             "/admin/ratelimits/policy/", "/admin/ratelimits/policy/1/change/"):
    status = c.get(path).status_code
    assert status == 200, (path, status)
print(json.dumps(sorted(refused)))
"""


def _demo_requirements() -> set[str]:
    """The distributions `pip install -e '.[demo]'` installs: the app's own dependencies
    and the demo extra's, with theirs."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    found: set[str] = set()
    todo = [Requirement("django-ratelimits[demo]")]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        extras = set(req.extras)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in found:
            continue
        found.update({key, name})
        for line in md.requires(req.name) or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in extras | {""}):
                todo.append(dep)
    return {name for name in found if "[" not in name}


def test_the_demo_needs_nothing_beyond_django_drf_and_prometheus_client(demo_env):
    allowed = _demo_requirements()
    assert {"djangorestframework", "prometheus-client", "django"} <= allowed
    assert not {"pytest", "sybil", "playwright", "gunicorn"} & allowed
    out = run(["-c", NEEDS, json.dumps(sorted(allowed))],
              {**demo_env, "DJANGO_ALLOWED_HOSTS": "testserver"})
    assert out.returncode == 0, out.stderr
    # what it looked for beyond them (optional imports it does without: DRF's yaml ...)
    looked_for = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not looked_for & {"django", "rest_framework", "prometheus_client", "ratelimits"}
