"""Section 10: the demo under one uvicorn worker (ASGI), loaded by wrk.

    .venv/bin/python bench/asgi.py [--quick]

One uvicorn process serves `bench/e2e_settings.py` (the demo's settings and URLs, plus
/async-hello/, an async twin of /hello/), with a throwaway SQLite database and Redis
db 14; wrk keeps 50 connections busy (kept alive: uvicorn keeps them). Three ways to
serve the same async view: no rate limiting; our middleware deciding on the event loop
(the asyncio engine); and the same middleware handing each decision to a thread with
`sync_to_async` (bench/thread_hop.py), as it did before. Then the demo's /slow/ (an async
view that awaits 50 ms), without and with our middleware.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import Check, Section
from bench.e2e import CONNECTIONS, POLICIES, WRK_THREADS, prepare, run_once, wrk_table

SCENARIOS = [
    # (label, settings scenario, path)
    ("(g) /async-hello/, no rate limiting", "none", "/async-hello/"),
    ("(h) /async-hello/, our middleware, decided on the event loop", "ours",
     "/async-hello/"),
    ("(i) /async-hello/, our middleware, decided in a thread (sync_to_async)", "thread",
     "/async-hello/"),
    ("(j) /slow/ (awaits 50 ms), no rate limiting", "none", "/slow/"),
    ("(k) /slow/, our middleware, decided on the event loop", "ours", "/slow/"),
]


def uvicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "demo_project.asgi:application", "--host",
            "127.0.0.1", "--port", str(port), "--workers", "1", "--log-level", "warning",
            "--no-access-log"]


def run(quick: bool = False) -> Section:
    rounds, seconds, warmup = (1, 2, 1) if quick else (3, 6, 1)
    section = Section("10. ASGI: the demo under one uvicorn worker")
    common.flush(common.PEERS_DB)
    with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
        db = str(Path(tmp) / "bench-asgi.sqlite3")
        prepare(db, POLICIES["one"])
        runs: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in SCENARIOS}
        for _ in range(rounds):
            for label, scenario, path in SCENARIOS:
                runs[label].append(run_once(db, scenario, path, seconds, warmup, uvicorn))
    results, med = wrk_table(runs)
    section.add(
        "`uvicorn demo_project.asgi:application --workers 1` with `bench/e2e_settings.py`; "
        f"`wrk -t{WRK_THREADS} -c{CONNECTIONS}` (keep-alive) on the same cores, every "
        "request naming one of 1,000 clients in X-Forwarded-For; "
        f"{seconds:g} s measured after {warmup:g} s of warm-up, {rounds} interleaved "
        "repetitions (a fresh uvicorn each), medians. Ours: one enforced `fixed_window` "
        "policy of 10⁶ per minute on key `global`, every request one FCALL. (h) awaits it "
        "with redis.asyncio on the event loop; (i) is the same middleware handing the "
        "decision to `sync_to_async`'s thread, as before the asyncio engine."
    )
    section.add(results)
    g, h, i, j, k = (med[label] for label, *_ in SCENARIOS)
    section.checks += [
        Check("(h) our async middleware vs (g) no rate limiting", h / g, "≥ 0.8×", h / g >= 0.8),
        Check("(h) decided on the event loop vs (i) in a thread", h / i, "reference", True),
        Check("(k) /slow/ with our middleware vs (j) without", k / j, "reference", True),
    ]
    common.flush(common.PEERS_DB)
    return section


if __name__ == "__main__":
    common.run_section(run)
