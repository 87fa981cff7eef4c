"""Section 3: end to end, the demo site under gunicorn, loaded by wrk.

    .venv/bin/python bench/e2e.py [--quick]

gunicorn runs `demo_project.wsgi` with 2 × cores + 1 sync workers and
bench/e2e_settings.py (the demo's settings, one scenario chosen by environment variable),
Redis db 14 through django-redis, and a throwaway SQLite database migrated in a temporary
directory. wrk (Debian's; `make bench` installs it) keeps 50 connections busy; gunicorn's
sync workers close the connection after every response, so every request opens a new one.
Each request names one of 1,000 clients in X-Forwarded-For (bench/wrk_clients.lua), which
the settings trust from 127.0.0.1: per-IP policies and DRF's throttles see many clients.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section, fmt_rate, median, spread, table

#: gunicorn's advice for sync workers: 2 × cores + 1
WORKERS = 2 * (os.cpu_count() or 1) + 1
CONNECTIONS = 50
WRK_THREADS = 2
#: names each request's client, one of 1,000, in X-Forwarded-For
WRK_SCRIPT = Path(__file__).resolve().parent / "wrk_clients.lua"
_IP = {"limit": 1_000_000_000, "key": "ip"}
_HOT = {"algorithm": "fixed_window", "limit": 1_000_000, "key": "global"}
#: The policy sets, each in a database of its own: the enforced, admitting policies every
#: request of a scenario meets, as an operator would write them.
POLICIES: dict[str, list[dict[str, object]]] = {
    "three": [
        {"name": "bench-gcra", "algorithm": "gcra", **_IP},
        {"name": "bench-sliding", "algorithm": "sliding_window", **_IP},
        {"name": "bench-fixed", "algorithm": "fixed_window", **_IP},
    ],
    # one hot policy of 10⁶ per minute, every request to the store ...
    "one": [{"name": "bench-hot", **_HOT}],
    # ... and the same policy leasing 100 units at a time
    "leased": [{"name": "bench-hot", **_HOT, "batch": 100}],
    # the three of "three", each worker counting alone
    "per_process": [
        {"name": "bench-gcra", "algorithm": "gcra", **_IP, "counting": "per_process"},
        {"name": "bench-sliding", "algorithm": "sliding_window", **_IP,
         "counting": "per_process"},
        {"name": "bench-fixed", "algorithm": "fixed_window", **_IP, "counting": "per_process"},
    ],
    # a flood: one client (key global: every request is that client) far over its limit
    "flood": [{"name": "bench-flood", "algorithm": "fixed_window", "limit": 5,
               "key": "global"}],
    # none from the operator: the compat throttles' policies are declared in code
    "declared": [],
}
SCENARIOS = [
    # (label, settings scenario, path, policy set)
    ("(a) /hello/, no rate limiting", "none", "/hello/", "three"),
    ("(a0) /hello/, the floor: one EVALSHA of `return 1` per request", "floor", "/hello/",
     "three"),
    ("(b) /hello/, our middleware, 3 policies", "ours", "/hello/", "three"),
    ("(b1) /hello/, our middleware, 1 policy of 10⁶/min", "ours", "/hello/", "one"),
    ("(b') /hello/, our middleware, 1 policy of 10⁶/min with batch 100", "ours", "/hello/",
     "leased"),
    ("(b'') /hello/, our middleware, 3 per_process policies", "ours", "/hello/",
     "per_process"),
    ("(f) /hello/, one client flooding an enforced 5/min", "ours", "/hello/", "flood"),
    ("(a') /api/items/ (DRF view), no throttling", "none", "/api/items/", "three"),
    ("(c) /api/items/, DRF AnonRateThrottle + UserRateThrottle", "drf", "/api/items/", "three"),
    ("(c') /api/items/, ratelimits.compat.drf AnonRateThrottle + UserRateThrottle", "compat",
     "/api/items/", "declared"),
    ("(d) /api/items/, our middleware + PolicyThrottle, 3 policies", "ours", "/api/items/",
     "three"),
    ("(e) /dr-hello/, django-ratelimit `@ratelimit(key='ip', rate='1000000/m')`", "dr",
     "/dr-hello/", "declared"),
    ("(e') /dr-hello/, the same decorator from ratelimits.compat.django_ratelimit",
     "drcompat", "/dr-hello/", "declared"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(db: str, scenario: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "bench.e2e_settings",
        "BENCH_E2E_SCENARIO": scenario,
        "BENCH_DRF_RATE": "1000000/min",
        "REDIS_URL": common.PEERS_URL,
        "DEMO_DB": db,
        "PYTHONPATH": str(common.ROOT),
    })
    return env


def prepare(db: str, policies: list[dict[str, object]]) -> None:
    python = sys.executable
    env = server_env(db, "ours")
    subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=common.ROOT,
                   env=env, check=True)
    code = (
        "from ratelimits.models import Policy\n"
        f"for p in {policies!r}:\n"
        "    p = dict(p)\n"
        "    policy, _ = Policy.objects.update_or_create(name=p.pop('name'), defaults=dict(\n"
        "        mode='enforce', period=60, path='*', **p))\n"
        "    policy.full_clean()\n"
        # the demo's limits declared in code (its /quote/ view) apply to their view only
        f"assert Policy.objects.filter(mode='enforce', declared=False).count() == "
        f"{len(policies)}\n"
    )
    subprocess.run([python, "manage.py", "shell", "-c", code], cwd=common.ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)


def get_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        # a client named as wrk names them (django-ratelimit's key reads only the header)
        conn.request("GET", path, headers={"Accept": "application/json",
                                           "X-Forwarded-For": "10.1.0.1"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def wrk(port: int, path: str, seconds: int) -> dict[str, float]:
    """One wrk run; its requests per second, latency percentiles and failures."""
    out = subprocess.run(
        [common.wrk(), "-t", str(WRK_THREADS), "-c", str(CONNECTIONS), "-d", f"{seconds}s",
         "--latency", "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.MULTILINE))
    requests = re.search(r"^\s+(\d+) requests in", out, re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                       r"timeout (\d+)", out)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.MULTILINE)
    if not (rps and requests and len(percentiles) == 2):
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return {
        "rps": float(rps.group(1)),
        "p50": _ms(percentiles["50"]),
        "p99": _ms(percentiles["99"]),
        "n": int(requests.group(1)),
        "bad": (int(non_2xx.group(1)) if non_2xx else 0)
        + (sum(int(g) for g in errors.groups()) if errors else 0),
    }


def _scripts_run() -> int:
    """Scripts and functions the run's private Redis has run so far (INFO commandstats)."""
    stats = common.redis_client(common.PEERS_DB).info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("evalsha", "fcall"))


def gunicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "demo_project.wsgi", "-w", str(WORKERS), "-b",
            f"127.0.0.1:{port}", "--log-level", "warning"]


def start_server(db: str, scenario: str, path: str,
                 server_command: Any = gunicorn) -> tuple[subprocess.Popen[bytes], int]:
    """A server started with `server_command(port)` in its own session, once `path`
    answers 200; (the server, its port). Stop it with `stop_server`."""
    port = free_port()
    server = subprocess.Popen(
        server_command(port),
        cwd=common.ROOT, env=server_env(db, scenario), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.time() + 30
    status: int | str = "no answer"
    while True:
        try:
            status = get_status(port, path)
            if status == 200:
                return server, port
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"the server did not start: {server.stderr.read().decode()}")  # type: ignore[union-attr]
        if time.time() > deadline:  # still running: its stderr would never end
            stop_server(server)
            raise RuntimeError(f"{path} answered {status} for 30 s (scenario {scenario})")
        time.sleep(0.1)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """Stop a server of `start_server` and every process of its session."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def run_once(db: str, scenario: str, path: str, seconds: int, warmup: int,
             server_command: Any = gunicorn) -> dict[str, float]:
    """One server started with `server_command(port)`, warmed up, then loaded by wrk."""
    server, port = start_server(db, scenario, path, server_command)
    try:
        wrk(port, path, warmup)  # connections, imports and caches warmed
        scripts = _scripts_run()
        result = wrk(port, path, seconds)
        result["scripts/s"] = (_scripts_run() - scripts) / seconds
        return result
    finally:
        stop_server(server)


def wrk_table(runs: dict[str, list[dict[str, float]]]) -> tuple[str, dict[str, float]]:
    """The table of wrk runs per scenario (medians, spread, totals), and each scenario's
    median requests per second."""
    rows, med = [], {}
    for label, rs in runs.items():
        med[label] = median([r["rps"] for r in rs])
        rows.append([label, fmt_rate(med[label]), spread([r["rps"] for r in rs]),
                     f"{median([r['p50'] for r in rs]):.2f}",
                     f"{median([r['p99'] for r in rs]):.2f}",
                     f"{sum(r['n'] for r in rs):,}", sum(r["bad"] for r in rs)])
    header = ["scenario", "req/s", "±", "p50 ms", "p99 ms", "requests", "non-200"]
    return table(header, rows), med


def run(quick: bool = False) -> Section:
    rounds, seconds, warmup = (1, 2, 1) if quick else (3, 8, 1)  # wrk takes whole seconds
    section = Section("3. End to end: the demo under gunicorn")
    common.flush(common.PEERS_DB)
    with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
        dbs = {name: str(Path(tmp) / f"bench-{name}.sqlite3") for name in POLICIES}
        for name, policies in POLICIES.items():
            prepare(dbs[name], policies)
        runs: dict[str, list[dict]] = {label: [] for label, *_ in SCENARIOS}
        for _ in range(rounds):
            for label, scenario, path, policies in SCENARIOS:
                runs[label].append(run_once(dbs[policies], scenario, path, seconds, warmup))
    results, med = wrk_table(runs)
    section.add(
        f"`gunicorn demo_project.wsgi -w {WORKERS}` (sync workers: 2 × cores + 1) with "
        f"`bench/e2e_settings.py`; `wrk -t{WRK_THREADS} -c{CONNECTIONS}` on the same cores, "
        "a new connection per request (gunicorn's sync workers close each), every request "
        "naming one of 1,000 clients in X-Forwarded-For behind the trusted 127.0.0.1; "
        f"{seconds:g} s measured after {warmup:g} s of warm-up, {rounds} interleaved "
        "repetitions (a fresh gunicorn each), medians. Latency is wrk's, per request. "
        "(a0), the floor: `bench/floor.py`, a middleware in ours' place that sends one "
        "redis-py `EVALSHA` of `return 1` per request and nothing else: the round trip no "
        "limiter deciding in Redis avoids. "
        "Ours: three enforced policies on every path (`gcra`, `sliding_window`, "
        "`fixed_window`, key `ip`, 10⁹ per minute), decided in one FCALL per request; "
        "(b1) and (b'): one `fixed_window` policy of 10⁶ per minute on key `global`, "
        "without `batch` (one FCALL per request) and with `batch` 100 (a lease call per "
        "100 requests or per second per worker, the rest decided in process). "
        "(b''): the three of (b) with `counting = per_process`, decided in each worker. "
        "(f): every request of one client (key `global`) against an enforced 5 per minute: "
        "after the first five, 429s, each worker asking Redis about once a second (the "
        "deny cache); Redis scripts per second are counted with INFO commandstats. "
        "DRF: `AnonRateThrottle` + `UserRateThrottle` at 1,000,000/min (the request is "
        "anonymous, so the user throttle falls back to the IP too: two cache GETs and two "
        "SETs of the history list). (c'): the same two classes and rates from "
        "`ratelimits.compat.drf` (DRF's API, each scope a `sliding_log` policy declared in "
        "code), both decided in one FCALL per request, no middleware, as (c). "
        "(e): /hello/'s view under django-ratelimit's own `@ratelimit(key='ip', "
        "rate='1000000/m', block=True)`, the client read from X-Forwarded-For "
        "(`RATELIMIT_IP_META_KEY`), no middleware: a `cache.add` per request, and a "
        "`cache.incr` after it when the client has been counted in this minute already "
        "(with 1,000 clients, nearly every request). (e'): the same decorator, arguments "
        "and setting from `ratelimits.compat.django_ratelimit` (a `fixed_window` policy "
        "declared in code, one FCALL per request), no middleware, as (e). Redis db 14 "
        "via django-redis for all."
    )
    section.add(results)
    a, floor, b, b1, leased, alone, flood, a2, c, compat, d, dr, dr_compat = (
        med[label] for label, *_ in SCENARIOS)
    flood_scripts = median([r["scripts/s"] for r in runs[SCENARIOS[6][0]]])
    section.checks += [
        Check("(a0) the floor vs (a) no rate limiting", floor / a, "reference", True),
        Check("(b) 3 policies vs (a0) the floor", b / floor, "≥ 0.85×", b / floor >= 0.85),
        Check("(b1) 1 policy, no batch vs (a0) the floor", b1 / floor, "≥ 0.9×",
              b1 / floor >= 0.9),
        Check("(b) our middleware vs (a) no rate limiting", b / a, "≥ 0.85×", b / a >= 0.85),
        Check("(b1) 1 policy, no batch vs (a) no rate limiting", b1 / a, "reference", True),
        Check("(b') 1 policy, batch 100 vs (a) no rate limiting", leased / a, "≥ 0.9×",
              leased / a >= 0.9),
        Check("(b'') per_process policies vs (a) no rate limiting", alone / a, "≥ 0.9×",
              alone / a >= 0.9),
        Check("(f) a flood, answered 429 vs (a) no rate limiting", flood / a, "≥ 0.9×",
              flood / a >= 0.9),
        Check("(f) Redis scripts per second during the flood", round(flood_scripts, 1),
              "reference", True, unit="/s"),
        Check("(c) DRF throttles vs (a') unthrottled DRF view", c / a2, "reference", True),
        Check("(d) ours on the DRF view vs (a') unthrottled DRF view", d / a2, "reference", True),
        Check("(d) ours vs (c) DRF throttles, same view", d / c, "≥ 1.5×", d / c >= 1.5),
        Check("(c') ours with DRF's API vs (c) DRF's own throttles, same classes and rates",
              compat / c, "≥ 1.5×", compat / c >= 1.5),
        Check("(e) django-ratelimit vs (a) no rate limiting", dr / a, "reference", True),
        Check("(e') ours with django-ratelimit's API vs (e) django-ratelimit, same decorator",
              dr_compat / dr, "≥ 1.0×", dr_compat / dr >= 1.0),
    ]
    common.flush(common.PEERS_DB)
    return section


if __name__ == "__main__":
    common.run_section(run)
