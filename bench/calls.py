"""Section 12: what a request costs in Python calls, beside no limiter and the floor.

    .venv/bin/python bench/calls.py [--quick] [--walk CASE [--trace]]

Timings drift 10-30 % on a shared machine; a count of function calls does not. Each case
serves requests through Django's own `WSGIHandler` (or `ASGIHandler`, on one event loop)
in a child process (section 3's settings and URLs, `bench/e2e_settings.py`, on the run's
Redis), warms up, then counts with `sys.setprofile` every Python function call made while
serving each of a few hundred requests from 1,000 clients. Under ASGI the count is the
event loop's thread: what Django hands to `sync_to_async` threads (the demo's
synchronous middleware) is not counted, in either the case or its baseline. A case's
figure is the mean per request, minus the same count for the same URL with no limiter:
what the limiter adds. The floor is a
middleware that makes one redis-py `EVALSHA` of `return 1` and nothing else: the round
trip a store-backed limiter cannot avoid.

Beside the calls: the package modules a request enters (`ratelimits/...`), and how often
a request moves from one package module to another. `--walk CASE` prints the package
modules of one request of that case, in the order they are first entered; with `--trace`,
every call that request makes, indented by depth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, e2e
from bench.common import Check, Section, table

CLIENTS = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(1000)]
PACKAGE = str(common.ROOT / "ratelimits") + "/"
#: the profiler's events that are a call
CALLS = frozenset({"call", "c_call"})

#: The policy sets of section 3, and one of a single policy counted in process.
POLICIES: dict[str, list[dict[str, object]]] = {
    **e2e.POLICIES,
    "one_per_process": [{"name": "bench-fixed", "algorithm": "fixed_window",
                         "limit": 1_000_000_000, "key": "ip", "counting": "per_process"}],
    # requests in flight: a slot taken in the decision's call, released after the response
    "concurrency": [{"name": "bench-inflight", "algorithm": "concurrency",
                     "limit": 1_000_000, "key": "global"}],
}


@dataclass(frozen=True)
class Case:
    label: str
    scenario: str  # bench/e2e_settings.py's BENCH_E2E_SCENARIO
    path: str
    policies: str  # a key of POLICIES
    status: int  # what every measured request must answer
    baseline: str  # the label of the case with no limiter for the same URL
    asgi: bool = False  # served by ASGIHandler on an event loop, not WSGIHandler


NONE_HELLO = "/hello/, no rate limiting"
NONE_API = "/api/items/ (DRF view), no throttling"
FLOOR = "/hello/, the floor: one EVALSHA of `return 1`"
ONE = "/hello/, 1 policy decided in Redis"
PER_PROCESS = "/hello/, 1 per_process policy"
PER_PROCESS_3 = "/hello/, 3 per_process policies (section 3's (b''))"
FLOOD = "/hello/, a refused client answered from the deny cache (429)"
THREE = "/hello/, 3 policies decided in Redis"
LEASED = "/hello/, 1 policy leasing 100 units at a time"
CONCURRENCY = "/hello/, 1 concurrency policy (its slot released after the response)"
DRF = "/api/items/, middleware + PolicyThrottle, 3 policies"
DRF_OWN = "/api/items/, DRF's own Anon + UserRateThrottle"
COMPAT_DRF = "/api/items/, ratelimits.compat.drf Anon + UserRateThrottle"
COMPAT_DR = "/dr-hello/, ratelimits.compat.django_ratelimit `@ratelimit`"
DR_OWN = "/dr-hello/, django-ratelimit's own `@ratelimit`"
NONE_ASGI = "ASGI /async-hello/, no rate limiting"
ASGI_ONE = "ASGI /async-hello/, 1 policy decided in Redis on the event loop"

CASES = [
    Case(NONE_HELLO, "none", "/hello/", "three", 200, NONE_HELLO),
    Case(FLOOR, "floor", "/hello/", "three", 200, NONE_HELLO),
    Case(ONE, "ours", "/hello/", "one", 200, NONE_HELLO),
    Case(PER_PROCESS, "ours", "/hello/", "one_per_process", 200, NONE_HELLO),
    Case(PER_PROCESS_3, "ours", "/hello/", "per_process", 200, NONE_HELLO),
    Case(FLOOD, "ours", "/hello/", "flood", 429, NONE_HELLO),
    Case(THREE, "ours", "/hello/", "three", 200, NONE_HELLO),
    Case(LEASED, "ours", "/hello/", "leased", 200, NONE_HELLO),
    Case(CONCURRENCY, "ours", "/hello/", "concurrency", 200, NONE_HELLO),
    Case(NONE_API, "none", "/api/items/", "three", 200, NONE_API),
    Case(DRF, "ours", "/api/items/", "three", 200, NONE_API),
    Case(DRF_OWN, "drf", "/api/items/", "three", 200, NONE_API),
    Case(COMPAT_DRF, "compat", "/api/items/", "declared", 200, NONE_API),
    Case(COMPAT_DR, "drcompat", "/dr-hello/", "declared", 200, NONE_HELLO),
    Case(DR_OWN, "dr", "/dr-hello/", "declared", 200, NONE_HELLO),
    Case(NONE_ASGI, "none", "/async-hello/", "one", 200, NONE_ASGI, asgi=True),
    Case(ASGI_ONE, "ours", "/async-hello/", "one", 200, NONE_ASGI, asgi=True),
]


class Counter:
    """A `sys.setprofile` function counting one request's calls and package modules."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.calls = self.python = self.changes = self.depth = 0
        self.current = ""
        self.entered: dict[str, None] = {}  # package modules, in the order first entered
        self.trace: list[str] | None = None  # every call, indented by depth (`--trace`)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.trace is not None:
            self.traced(frame, event, arg)
        if event not in CALLS:
            return
        self.calls += 1  # a Python function, or one of C (a builtin, a method of C)
        if event != "call":
            return
        self.python += 1
        filename = frame.f_code.co_filename
        if filename.startswith(PACKAGE):
            module = filename[len(PACKAGE) - len("ratelimits/"):-3]
            self.entered.setdefault(module, None)
            if module != self.current:
                self.changes += 1
                self.current = module


    def traced(self, frame: Any, event: str, arg: Any) -> None:
        assert self.trace is not None
        if event in ("return", "c_return", "c_exception"):
            self.depth -= 1
            return
        if event == "call":
            filename = frame.f_code.co_filename
            where = (filename[len(PACKAGE) - len("ratelimits/"):-3]
                     if filename.startswith(PACKAGE) else Path(filename).name)
            name = f"{where}:{frame.f_code.co_qualname}"
        elif event == "c_call":
            name = f"[c] {getattr(arg, '__qualname__', arg)}"
        else:
            return
        self.trace.append("  " * self.depth + name)
        self.depth += 1


def asgi_server(path: str, counter: Counter) -> Any:
    """`serve(i, counted)`: one GET of `path` from client `i` through Django's ASGI
    handler, run to its end on one event loop (the asyncio engine keeps its connections
    per loop, as under uvicorn); its status line."""
    import asyncio

    from django.core.handlers.asgi import ASGIHandler

    app, loop = ASGIHandler(), asyncio.new_event_loop()

    async def request(i: int, counted: bool) -> int:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"),
                             (b"x-forwarded-for", CLIENTS[i % len(CLIENTS)].encode())],
                 "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80)}
        asked = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not asked.is_set():
                asked.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Future()  # the client stays: Django's disconnect watch waits
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        if counted:
            sys.setprofile(counter)
        try:
            await app(scope, receive, send)
        finally:
            sys.setprofile(None)
        return int(sent[0]["status"])

    def serve(i: int, counted: bool) -> str:
        return str(loop.run_until_complete(request(i, counted)))

    return serve


def child(path: str, status: int, requests: int, walk: bool,
          trace: bool = False, asgi: bool = False) -> dict[str, Any]:
    """Serve requests through the WSGI (or ASGI) handler in this process, counting the
    calls."""
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.client import RequestFactory

    app, factory, counter = WSGIHandler(), RequestFactory(), Counter()
    served_asgi = asgi_server(path, counter) if asgi else None

    def serve(i: int, counted: bool) -> None:
        if served_asgi is not None:
            answered = served_asgi(i, counted)
            if counted and answered != str(status):
                raise RuntimeError(f"{path} answered {answered}, expected {status}")
            return
        environ = factory.get(path, HTTP_HOST="127.0.0.1",
                              HTTP_X_FORWARDED_FOR=CLIENTS[i % len(CLIENTS)]).environ
        seen: list[str] = []

        def start_response(given: str, headers: Any, exc_info: Any = None) -> Any:
            seen.append(given)
            return lambda data: None

        if counted:
            sys.setprofile(counter)
        try:
            body = app(environ, start_response)
            b"".join(body)
            body.close()
        finally:
            sys.setprofile(None)
        if counted and not seen[0].startswith(str(status)):
            raise RuntimeError(f"{path} answered {seen[0]}, expected {status}")

    for i in range(2_000):  # warm: imports, the snapshot, connections, caches, leases
        serve(i, counted=False)  # (a flood's first requests are admitted: not checked)
    calls, python, modules, changes = [], [], [], []
    for i in range(requests):
        counter.clear()
        if trace:
            counter.trace = []
        serve(i * 7, counted=True)
        if trace:
            return {"walk": counter.trace or []}
        if walk:
            return {"walk": list(counter.entered)}
        calls.append(counter.calls)
        python.append(counter.python)
        modules.append(len(counter.entered))
        changes.append(counter.changes)
    return {"calls": sum(calls) / requests, "python": sum(python) / requests,
            "modules": max(modules), "changes": sum(changes) / requests}


def measure(case: Case, db: str, requests: int, walk: bool = False,
            trace: bool = False) -> dict[str, Any]:
    env = {**e2e.server_env(db, case.scenario), common.PORT_VARIABLE: str(common.REDIS_PORT)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", case.path, "--status", str(case.status),
         "--requests", str(requests), *(["--walk-child"] if walk else []),
         *(["--asgi"] if case.asgi else []),
         *(["--trace-child"] if trace else [])],
        env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{case.label} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def counts(quick: bool = False, only: list[Case] | None = None) -> dict[str, dict[str, Any]]:
    """Each case's mean calls per request, modules entered and module changes."""
    requests = 100 if quick else 400
    common.flush(common.PEERS_DB)
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
        databases: dict[str, str] = {}
        for case in only or CASES:
            if case.policies not in databases:
                databases[case.policies] = str(Path(tmp) / f"{case.policies}.sqlite3")
                e2e.prepare(databases[case.policies], POLICIES[case.policies])
            found[case.label] = measure(case, databases[case.policies], requests)
    return found


def run(quick: bool = False) -> Section:
    section = Section("12. Python calls per request")
    found = counts(quick)
    by_label = {c.label: c for c in CASES}

    def beyond(label: str, count: str = "calls") -> float:
        return found[label][count] - found[by_label[label].baseline][count]

    rows = [[c.label, f"{found[c.label]['calls']:.0f}",
             "—" if c.baseline == c.label else f"+{beyond(c.label):.0f}",
             "—" if c.baseline == c.label else f"+{beyond(c.label, 'python'):.0f}",
             found[c.label]["modules"], f"{found[c.label]['changes']:.0f}"] for c in CASES]
    section.add(
        "Function calls per request counted with `sys.setprofile` (exact: the same on a "
        "busy machine), those of Python functions and of C ones (builtins, methods of "
        "C types) both, through Django's `WSGIHandler` in one process (the ASGI rows: "
        "its `ASGIHandler` on one event loop, counting that loop's thread), section 3's "
        "settings, policies and URLs, on the run's Redis; the mean of "
        f"{100 if quick else 400} requests from 1,000 clients after 2,000 of warm-up (so "
        "the periodic work, a tally's flush or a heartbeat, counts its share). *Beyond no "
        "limiter* subtracts the same URL served with no limiter; *of them Python* counts only "
        "the calls of Python functions. *Modules* is how many "
        "package modules (`ratelimits/...`) one request enters at most; *changes* how "
        "often a request moves from one package module to another.\n\n"
        + table(["case", "calls", "beyond no limiter", "of them Python", "package modules",
                 "module changes"], rows)
    )
    floor = beyond(FLOOR)
    section.checks += [
        Check("calls: the floor, one bare EVALSHA, beyond no limiter", floor, "reference",
              True, unit=" calls"),
        Check("calls: 1 policy in Redis, beyond the floor", round(beyond(ONE) - floor),
              "≤ 60 calls", beyond(ONE) - floor <= 60, unit=" calls"),
        Check("calls: 1 per_process policy, beyond no limiter", round(beyond(PER_PROCESS)),
              "≤ 60 calls", beyond(PER_PROCESS) <= 60, unit=" calls"),
        Check("calls: a deny-cache 429, beyond no limiter", round(beyond(FLOOD)),
              "≤ 120 calls", beyond(FLOOD) <= 120, unit=" calls"),
        Check("package modules a Redis-decided request enters", found[ONE]["modules"],
              "≤ 12", found[ONE]["modules"] <= 12, unit=" modules"),
    ]
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--walk", metavar="CASE", help="a case's label, or part of it")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--status", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=400, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true",
                        help="with --walk: every call of the request, indented by depth")
    parser.add_argument("--walk-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--asgi", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.status, args.requests, args.walk_child,
                               args.trace_child, args.asgi)))
        return
    if args.walk:
        case = next(c for c in CASES if args.walk.lower() in c.label.lower())
        with tempfile.TemporaryDirectory(prefix="ratelimits-bench-") as tmp:
            db = str(Path(tmp) / "walk.sqlite3")
            e2e.prepare(db, POLICIES[case.policies])
            got = measure(case, db, 1, walk=True, trace=args.trace)
        if args.trace:
            print("\n".join(got["walk"]))
            return
        print(f"{case.label}: {len(got['walk'])} package modules\n  " + "\n  ".join(got["walk"]))
        return
    print(run(args.quick).markdown())


if __name__ == "__main__":
    main()
