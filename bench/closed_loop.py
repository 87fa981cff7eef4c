"""A service that slows down as it fills up, and closed-loop clients to load it.

The service (`busy`, and `abusy` for ASGI) takes `UNIT` seconds per request in flight in
its process when it starts: 50 ms alone, 2 s among 40 (`CLOSED_LOOP_UNIT` in the
server's environment sets another). Its throughput is about the same whatever the
concurrency (1 / UNIT a second); only the latency grows with the queue. That is the
case an adaptive limit is for: admit what the service turns around at its best latency,
refuse the rest at once.

`load()` runs `clients` threads, each sending its next request as soon as the last
answered (a closed loop, as browsers and API clients do); a refused client waits about
the response's Retry-After (at most `MAX_BACKOFF`), jittered by ±50% as a well-behaved
client does, so that clients refused together do not all come back together.
Only requests that start after `warmup` count.
"""

from __future__ import annotations

import asyncio
import http.client
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The service's latency per request in flight (seconds). Far above what Django itself
#: takes per request (2-5 ms on a small VM), as for a service worth limiting (database
#: queries, calls upstream): its own latency, not the framework's, is what the limit
#: learns from.
UNIT = float(os.environ.get("CLOSED_LOOP_UNIT", "0.050"))
#: A refused client waits for Retry-After, but at most this long (seconds).
MAX_BACKOFF = 1.0

_in_flight = 0
_lock = threading.Lock()


def _enter() -> int:
    global _in_flight
    with _lock:
        _in_flight += 1
        return _in_flight


def _leave() -> None:
    global _in_flight
    with _lock:
        _in_flight -= 1


def busy(request: Any) -> Any:
    """The service as a blocking view: UNIT × requests in flight at its start."""
    from django.http import HttpResponse

    n = _enter()
    try:
        time.sleep(UNIT * n)
    finally:
        _leave()
    return HttpResponse(str(n))


async def abusy(request: Any) -> Any:
    """The service as an async view (the event loop serves others while it waits)."""
    from django.http import HttpResponse

    n = _enter()
    try:
        await asyncio.sleep(UNIT * n)
    finally:
        _leave()
    return HttpResponse(str(n))


@dataclass(frozen=True)
class Load:
    """What `clients` closed-loop clients got over `seconds`."""

    clients: int
    seconds: float
    admitted: int
    refused: int
    latencies: tuple[float, ...]  # of the admitted requests, seconds, sorted

    @property
    def throughput(self) -> float:
        """Admitted requests per second."""
        return self.admitted / self.seconds

    def percentile(self, p: float) -> float:
        """The `p`-th percentile latency of the admitted requests (seconds)."""
        if not self.latencies:
            return math.inf
        n = len(self.latencies)
        return self.latencies[min(n - 1, math.ceil(p / 100 * n) - 1)]

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p95(self) -> float:
        return self.percentile(95)


def load(port: int, path: str, clients: int, seconds: float, *, warmup: float = 1.0,
         host: str = "127.0.0.1") -> Load:
    """`clients` closed-loop clients on `path` for `warmup + seconds`; what the requests
    that ended in the last `seconds` got (counting by end, not start, keeps a request
    still running when the span ends out of it)."""
    start = time.monotonic() + warmup
    end = start + seconds
    records: list[tuple[int, float]] = []  # (status, latency) of requests ended in span
    guard = threading.Lock()

    def client(seed: int) -> None:
        jitter = random.Random(seed)
        conn = http.client.HTTPConnection(host, port, timeout=30)
        mine: list[tuple[int, float]] = []
        try:
            while (sent := time.monotonic()) < end:
                try:
                    conn.request("GET", path)
                    response = conn.getresponse()
                    response.read()
                except (OSError, http.client.HTTPException):
                    conn.close()  # the server closed a kept-alive connection: reconnect
                    continue
                ended = time.monotonic()
                if start <= ended <= end:
                    mine.append((response.status, ended - sent))
                if response.status != 200:
                    wait = min(MAX_BACKOFF, _retry_after(response))
                    # a wait past the end sends nothing more: the run is over at `end`
                    time.sleep(max(0.0, min(wait * jitter.uniform(0.5, 1.5),
                                            end - time.monotonic())))
        finally:
            conn.close()
            with guard:
                records.extend(mine)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(warmup + seconds + 60)
    latencies = tuple(sorted(took for status, took in records if status == 200))
    return Load(clients, seconds, len(latencies), len(records) - len(latencies), latencies)


def _retry_after(response: http.client.HTTPResponse) -> float:
    try:
        return float(response.getheader("Retry-After") or 1)
    except ValueError:
        return 1.0


#: The fixed concurrency limits the sweep tries (requests in flight per process).
SWEEP = (1, 2, 4, 8, 16, 40)


@dataclass(frozen=True)
class Comparison:
    """One server's runs: unloaded, without a limit, each fixed limit, adaptive."""

    unloaded: Load
    unlimited: Load
    fixed: dict[int, Load]
    adaptive: Load

    @property
    def best_fixed(self) -> tuple[int, Load]:
        """The fixed limit of the sweep with the highest admitted throughput."""
        return max(self.fixed.items(), key=lambda kv: kv[1].throughput)


def compare(port: int, path: str, apply: Callable[[dict[str, Any] | None], None], *,
            clients: int = 40, seconds: float = 3.0, sweep: tuple[int, ...] = SWEEP,
            maximum: int = 40) -> Comparison:
    """The runs of `Comparison` on a server at `port`; `apply(fields)` puts a policy of
    those fields on `path` in place (None: no policy) and returns once it applies."""
    apply(None)
    unloaded = load(port, path, 1, seconds)
    unlimited = load(port, path, clients, seconds)
    fixed = {}
    for k in sweep:  # a fixed limit: an adaptive one whose floor is its maximum
        apply({"algorithm": "adaptive", "limit": k, "floor": k})
        fixed[k] = load(port, path, clients, seconds)
    apply({"algorithm": "adaptive", "limit": maximum, "floor": 1})
    adaptive = load(port, path, clients, seconds, warmup=3.0)
    return Comparison(unloaded, unlimited, fixed, adaptive)
