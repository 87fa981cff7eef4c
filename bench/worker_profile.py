"""Where a real worker's time goes: py-spy on one gunicorn worker of section 3, under wrk.

    .venv/bin/python bench/worker_profile.py [--policies one] [--seconds 10]

The site, settings, policy sets and load are section 3's (`bench/e2e.py`): the demo under
gunicorn with 2 × cores + 1 sync workers, wrk naming 1,000 clients. In one run, three
servers are loaded one after another: no rate limiting, the floor (one EVALSHA of
`return 1` per request) and ours with the chosen policy set (`one`, `three`, `leased`,
`per_process`, `flood`). For each: requests per second, and the workers' CPU per request
read from /proc (user + system time of every worker over the measured seconds, divided
by the requests served). While ours is loaded, py-spy samples one of its workers
(`--nonblocking`: the worker is never paused), and the samples taken while it served a
request are split by whose code they are in:

- the store's reply: a socket read of redis-py's parser (the worker waits for Redis, or
  for a core to run on, in it);
- ours: a ratelimits frame with no Django middleware chain below it (what our middleware
  does before and after the view, the store call's sending included), grouped by the
  innermost ratelimits function;
- Django: the handler, the other middleware, the view and the response;
- gunicorn: reading the request, writing the response, closing the connection.

The samples are taken on the wall clock of a worker that shares two cores with four others,
Redis and wrk: shares of the time a request is in the worker, not CPU. The CPU per request
is the /proc figure of the first table.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, e2e
from bench.common import fmt_rate, table

#: A frame of Django's middleware chain: below it, the next middleware or the view runs.
CHAIN = "convert_exception_to_response.<locals>.inner"
#: The frame of a sync worker serving one connection (its accept loop is not counted).
SERVING = "SyncWorker.handle "
#: redis-py's parser reading a reply from the socket.
READ = "_HiredisParser.read_from_socket "


def _workers(master: int) -> list[int]:
    """The pids whose parent is `master` (gunicorn's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == master:
                found.append(int(entry.name))
    return sorted(found)


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def load(db: str, scenario: str, seconds: int, profile: Path | None) -> dict[str, float]:
    """One server under wrk: requests/s and worker CPU µs per request (and py-spy's raw
    samples of one worker in `profile`)."""
    server, port = e2e.start_server(db, scenario, "/hello/")
    try:
        e2e.wrk(port, "/hello/", 1)  # warm: connections, imports, caches
        workers = _workers(server.pid)
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [_py_spy(), "record", "--pid", str(workers[0]), "--duration", str(seconds),
                 "--rate", "250", "--nonblocking", "--format", "raw", "--output",
                 str(profile)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
        before = _cpu_ticks(workers)
        result = e2e.wrk(port, "/hello/", seconds)
        ticks = _cpu_ticks(workers) - before
        if spy is not None and spy.wait(seconds + 30) != 0:
            raise RuntimeError(f"py-spy failed: {spy.stderr.read().decode()}")  # type: ignore[union-attr]
    finally:
        e2e.stop_server(server)
    per_request = ticks / os.sysconf("SC_CLK_TCK") / max(result["n"], 1) * 1e6
    return {"rps": result["rps"], "cpu_us": per_request, "bad": result["bad"]}


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise RuntimeError("py-spy is not installed: pip install py-spy (the bench extra)")
    return found


def _ours(frame: str) -> bool:
    """Whether a frame is in this package (py-spy writes paths from their sys.path entry:
    `ratelimits/...`, or the whole path of an editable install's checkout)."""
    return "(ratelimits/" in frame or "/ratelimits/" in frame


def _function(frame: str) -> str:
    """`name (path/to/ratelimits/x.py:12)` -> `ratelimits/x.py name`."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{path[path.rfind('ratelimits/'):]} {name}"


def split(raw: Path) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """(samples by part, our samples by innermost ratelimits function, samples serving)."""
    parts: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    serving = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith(SERVING) for f in frames):
            continue  # the accept loop, or a background thread
        n = int(count)
        serving += n
        if any(f.startswith(READ) for f in frames):
            parts["the store's reply (a socket read)"] += n
            continue
        first = next((i for i, f in enumerate(frames) if _ours(f)), None)
        if first is not None and not any(f.startswith(CHAIN) for f in frames[first:]):
            inner = max(i for i, f in enumerate(frames) if _ours(f))
            parts["ours"] += n
            ours[_function(frames[inner])] += n
        elif any("django/" in f for f in frames):
            parts["Django (handler, other middleware, view)"] += n
        else:
            parts["gunicorn (parse, write, close)"] += n
    return parts, ours, serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="one", choices=sorted(e2e.POLICIES))
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    opts = parser.parse_args()
    common.flush(common.PEERS_DB)
    with tempfile.TemporaryDirectory(prefix="ratelimits-profile-") as tmp:
        dbs = {name: str(Path(tmp) / f"{name}.sqlite3") for name in ("three", opts.policies)}
        for name, db in dbs.items():
            e2e.prepare(db, e2e.POLICIES[name])
        raw = Path(tmp) / "samples.txt"
        none = load(dbs["three"], "none", opts.seconds, None)
        floor = load(dbs["three"], "floor", opts.seconds, None)
        ours = load(dbs[opts.policies], "ours", opts.seconds, raw)
        parts, functions, serving = split(raw)
    common.flush(common.PEERS_DB)

    rows = [[label, fmt_rate(r["rps"]), f"{r['rps'] / none['rps']:.2f}×", f"{r['cpu_us']:.0f}",
             f"{r['cpu_us'] - none['cpu_us']:+.0f}", int(r["bad"])]
            for label, r in (("no rate limiting", none), ("the floor", floor),
                             (f"ours, policies {opts.policies!r}", ours))]
    print(f"# One worker's time, policies {opts.policies!r}, {common.machine()[0][1]}\n")
    print(table(["server", "req/s", "vs none", "worker CPU µs/request", "vs none", "non-2xx"],
                rows))
    print(f"\nOne worker of ours, {serving} samples while it served a request:\n")
    print(table(["part", "share"],
                [[part, f"{n / serving:.1%}"] for part, n in parts.most_common()]))
    print(f"\nOurs, by the innermost ratelimits function (top {opts.top}):\n")
    print(table(["function", "share"],
                [[f"`{name}`", f"{n / serving:.1%}"]
                 for name, n in functions.most_common(opts.top)]))


if __name__ == "__main__":
    main()
