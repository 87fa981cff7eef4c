"""Prometheus metrics: what each policy decided and how long the engine took.

Off unless `RATELIMITS["METRICS"]` is True and `prometheus_client` is installed. Whether
it is on is worked out once per settings value (`recorder_for(config)`), so the request
path pays one identity comparison when it is off and never attempts an import.

The metrics live in prometheus_client's default registry: a site that already exposes
it (django-prometheus, `start_http_server`, a multiprocess collector) gets ours on the
same page, and `ratelimits.urls` serves that registry for a site that does not.

In one process, a decision adds to plain lists under one lock, and prometheus_client
reads them when it is scraped (`InProcessRecorder`): a few C calls per request instead
of prometheus_client's per-increment locks and checks. With several worker processes
and `PROMETHEUS_MULTIPROC_DIR` set (before the workers start), each increment must reach
the worker's files at once, so that a scrape from any worker, or after a worker died,
shows the sum of every worker: there the values are prometheus_client's own, which write
through to those files (`MultiprocessRecorder`), and the view merges the files.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.engine.adaptive import AdaptiveEngine
from ratelimits.engine.memory import MemoryEngine
from ratelimits.engine.types import Outcome

logger = logging.getLogger("ratelimits")

#: Values of the `outcome` label: the engine's outcomes, and the store being out of reach.
OUTCOMES = (*(o.label for o in Outcome), "unavailable")
INDEX = {o: i for i, o in enumerate(Outcome)}
UNAVAILABLE = len(OUTCOMES) - 1

#: An engine call is one Redis round trip (or a dict lookup in process): tens of
#: microseconds to a few milliseconds, with the 100 ms default socket timeout as the tail.
#: Twelve buckets per backend: cheap to store, fine enough to see a slow Redis.
ENGINE_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)
#: Every bucket's upper bound, +Inf last as prometheus_client adds it. A latency belongs
#: to the first bound it is at or below (`le`): the one `bisect_left` finds.
BOUNDS = (*ENGINE_BUCKETS, math.inf)
#: Where a backend's tally keeps its sum of latencies, after one count per bound.
SUM = len(BOUNDS)

REQUESTS = ("ratelimits_requests", "Requests each rate-limit policy decided, by outcome.")
ENGINE_SECONDS = ("ratelimits_engine_seconds",
                  "Latency of the rate-limit engine call made for a request.")


def backend(kind: type) -> str:
    """The `backend` label of an engine class."""
    # one server or a cluster (ClusterEngine): both are Redis round trips; the
    # in-process engines (adaptive policies' too) answer without one
    return "memory" if issubclass(kind, (MemoryEngine, AdaptiveEngine)) else "redis"


class Recorder(abc.ABC):
    """Records decisions for Prometheus; never raises into the request."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Gauge  # optional: imported only once metrics are on

        self.adaptive_limit = Gauge(
            "ratelimits_adaptive_limit",
            "Requests in flight an adaptive policy admits in this process, as last learnt.",
            ["policy"],
            registry=registry,
            multiprocess_mode="liveall",  # one series per live worker: sum or average them
        )
        # A plain dict: a lost race only resolves the same child twice (labels() is locked).
        self._learnt: dict[str, Any] = {}

    @abc.abstractmethod
    def decided(self, engine: object, seconds: float, planned: Iterable[Any],
                decision: Any) -> None:
        """One engine answer: its latency and each policy's outcome (never raises).

        `planned`: (policy, identity) pairs in the order of `decision.results`; each
        result's outcome is the engine's own, the one its per-minute counters record.
        """

    @abc.abstractmethod
    def unavailable(self, engine: object, seconds: float, policies: Iterable[Any]) -> None:
        """The store failed: the failed call's latency; each policy's on_error decides."""

    def learnt(self, name: str, limit: int) -> None:
        """An adaptive policy's limit after a sample (never raises)."""
        try:
            child = self._learnt.get(name)
            if child is None:
                child = self._learnt[name] = self.adaptive_limit.labels(name)
            child.set(limit)
        except Exception as exc:
            _failed(exc)


class _Tallies(dict[str, list[float]]):
    """Counts by label value, each list made at its first use, and when (`_created`).

    A miss is `__missing__`, so a hit costs the request path no call."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.created: dict[str, float] = {}

    def __missing__(self, key: str) -> list[float]:
        self.created[key] = time.time()
        made = self[key] = [0.0] * self.width
        return made


class _ByEngine(dict[type, list[float]]):
    """An engine class's backend tally: engines of one backend share it."""

    def __init__(self, backends: _Tallies) -> None:
        super().__init__()
        self.backends = backends

    def __missing__(self, kind: type) -> list[float]:
        tally = self[kind] = self.backends[backend(kind)]
        return tally


class InProcessRecorder(Recorder):
    """Counts in plain lists, read by prometheus_client at each scrape (a collector).

    Exposes what prometheus_client's own Counter and Histogram would: the same names,
    labels, buckets, values and `_created` samples.
    """

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY  # optional, as above

        target = REGISTRY if registry is None else registry
        # `tally[i] += 1` reads, adds and stores: three bytecodes. Whether the GIL can
        # pass to another thread between them depends on the interpreter (CPython 3.10
        # may switch before almost any bytecode; 3.11 and later only at calls and
        # backward jumps, which no language rule promises), and a free-threaded build has
        # no GIL at all: an increment could be lost. A scrape could also see a decision
        # by halves (its latency counted, its outcome not yet). One lock makes a
        # decision's increments one step for both: uncontended, it costs one C call per
        # decision, and it is held for a few list stores, so a gthread worker's threads
        # rarely wait on it.
        self._lock = threading.Lock()
        self._policies = _Tallies(len(OUTCOMES))  # policy -> count per OUTCOMES
        self._backends = _Tallies(SUM + 1)  # backend -> count per BOUNDS, then the sum
        self._engines = _ByEngine(self._backends)
        target.register(self)
        super().__init__(target)

    def decided(self, engine: object, seconds: float, planned: Iterable[Any],
                decision: Any) -> None:
        try:
            with self._lock:
                tally = self._engines[type(engine)]
                tally[bisect_left(BOUNDS, seconds)] += 1
                tally[SUM] += seconds
                policies = self._policies
                for (policy, _), result in zip(planned, decision.results, strict=True):
                    policies[policy.name][INDEX[result.outcome]] += 1
        except Exception as exc:
            _failed(exc)

    def unavailable(self, engine: object, seconds: float, policies: Iterable[Any]) -> None:
        try:
            with self._lock:
                tally = self._engines[type(engine)]
                tally[bisect_left(BOUNDS, seconds)] += 1
                tally[SUM] += seconds
                for policy in policies:
                    self._policies[policy.name][UNAVAILABLE] += 1
        except Exception as exc:
            _failed(exc)

    # -- read by prometheus_client's registry ------------------------------------------

    def describe(self) -> list[Any]:
        """The two families without samples: the registry reserves their names."""
        return self._families([], [], created=False)

    def collect(self) -> list[Any]:
        """Both families as they stand: one consistent copy, taken under the lock."""
        # read at each scrape, as prometheus_client's own metrics do: its
        # disable_created_metrics() switches this flag
        from prometheus_client.metrics import _use_created  # optional, as above

        with self._lock:
            policies = [(k, list(v), self._policies.created[k])
                        for k, v in self._policies.items()]
            backends = [(k, list(v), self._backends.created[k])
                        for k, v in self._backends.items()]
        return self._families(policies, backends, created=_use_created)

    @staticmethod
    def _families(policies: list[tuple[str, list[float], float]],
                  backends: list[tuple[str, list[float], float]], created: bool) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, Metric  # optional, as above
        from prometheus_client.utils import floatToGoString

        requests = CounterMetricFamily(*REQUESTS, labels=["policy", "outcome"])
        for name, counts, since in policies:
            for outcome, count in zip(OUTCOMES, counts, strict=True):
                requests.add_metric([name, outcome], count, since if created else None)
        histogram = Metric(*ENGINE_SECONDS, "histogram")
        family = ENGINE_SECONDS[0]
        le = [floatToGoString(bound) for bound in BOUNDS]  # type: ignore[no-untyped-call]
        for label, tally, since in backends:
            labels = {"backend": label}
            cumulative = 0.0
            for bound, count in zip(le, tally, strict=False):  # the sum is not a bucket
                cumulative += count
                histogram.add_sample(f"{family}_bucket", {**labels, "le": bound}, cumulative)
            histogram.add_sample(f"{family}_count", labels, cumulative)
            histogram.add_sample(f"{family}_sum", labels, tally[SUM])
            if created:
                histogram.add_sample(f"{family}_created", labels, since)
        return [requests, histogram]


class MultiprocessRecorder(Recorder):
    """prometheus_client's Counter and Histogram, whose values live in the worker's files
    in PROMETHEUS_MULTIPROC_DIR: written at each increment, so no count waits in a
    worker's memory for a scrape that another worker answers, or that comes after the
    worker died. Slower per request than `InProcessRecorder`, which cannot promise that."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram  # optional, as above

        target = REGISTRY if registry is None else registry
        self.requests = Counter(*REQUESTS, ["policy", "outcome"], registry=target)
        self.engine_seconds = Histogram(*ENGINE_SECONDS, ["backend"], buckets=ENGINE_BUCKETS,
                                        registry=target)
        # Plain dicts: a lost race only resolves the same child twice (labels() is locked).
        self._policies: dict[str, tuple[Any, ...]] = {}
        self._backends: dict[type, Any] = {}
        super().__init__(target)

    def _children(self, name: str) -> tuple[Any, ...]:
        children = self._policies.get(name)
        if children is None:
            labels = self.requests.labels
            children = self._policies[name] = tuple(labels(name, o) for o in OUTCOMES)
        return children

    def _histogram(self, engine: object) -> Any:
        kind = type(engine)
        child = self._backends.get(kind)
        if child is None:
            child = self._backends[kind] = self.engine_seconds.labels(backend(kind))
        return child

    def decided(self, engine: object, seconds: float, planned: Iterable[Any],
                decision: Any) -> None:
        try:
            self._histogram(engine).observe(seconds)
            for (policy, _), result in zip(planned, decision.results, strict=True):
                self._children(policy.name)[INDEX[result.outcome]].inc()
        except Exception as exc:
            _failed(exc)

    def unavailable(self, engine: object, seconds: float, policies: Iterable[Any]) -> None:
        try:
            self._histogram(engine).observe(seconds)
            for policy in policies:
                self._children(policy.name)[UNAVAILABLE].inc()
        except Exception as exc:
            _failed(exc)


def new_recorder(registry: Any = None) -> Recorder:
    """The recorder for how prometheus_client stores values in this process."""
    from prometheus_client import values  # optional, as above

    # prometheus_client picks its value class once, when first imported, from
    # PROMETHEUS_MULTIPROC_DIR: the files its values write to are what the scrape merges
    if values.ValueClass is values.MutexValue:
        return InProcessRecorder(registry)
    return MultiprocessRecorder(registry)


_failure_logged = False


def _failed(exc: Exception) -> None:
    global _failure_logged
    if not _failure_logged:
        _failure_logged = True
        logger.exception("ratelimits: recording metrics failed (%s); logged only once", exc)


# -- whether metrics are on ------------------------------------------------------------------

_default: Recorder | None = None  # metrics register once per process in the default registry
_state: tuple[Any, Recorder | None] = (None, None)  # (the config it was decided for, recorder)


def recorder_for(config: Mapping[str, Any]) -> Recorder | None:
    """The recorder when metrics are on for this config, else None (cheap after the first)."""
    seen, recorder = _state
    if seen is config:
        return recorder
    return _decide(config)


def _decide(config: Mapping[str, Any]) -> Recorder | None:
    global _default, _state
    recorder = None
    if config["METRICS"] and available():
        if _default is None:
            _default = new_recorder()
        recorder = _default
    _state = (config, recorder)
    return recorder


@runtime.on_reset
def _forget() -> None:
    """Work out again whether metrics are on, and log the next failure. `_default` stays:
    its metrics are registered in prometheus_client's registry, once per process."""
    global _state, _failure_logged
    _state = (None, None)
    _failure_logged = False


def available() -> bool:
    """Whether prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


# -- the scrape view -------------------------------------------------------------------------


def multiprocess_dir() -> str | None:
    """prometheus_client's multiprocess directory, when the environment names one."""
    # prometheus_client still honours the old lower-case name
    old = os.environ.get("prometheus_multiproc_dir")  # noqa: SIM112
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or old


class _NoDirectory(Exception):
    """PROMETHEUS_MULTIPROC_DIR names something that is not a directory."""


def _registry() -> Any:
    from prometheus_client import REGISTRY  # optional: only reached with metrics on

    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    # Several worker processes, each writing its own files there: merge them, as
    # prometheus_client documents. Serving this process's registry instead would show
    # one worker's numbers, so a wrong directory is an error, not a fallback.
    if not os.path.isdir(path):
        raise _NoDirectory(path)
    from prometheus_client import CollectorRegistry, multiprocess  # optional, as above

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return registry


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The default registry in the exposition format the scraper asks for; 404 when off."""
    if recorder_for(get_config()) is None:
        raise Http404("ratelimits metrics are off")
    # optional: metrics are on, so it is installed
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        registry = _registry()
    except _NoDirectory as exc:
        message = (
            f"PROMETHEUS_MULTIPROC_DIR={exc.args[0]} is not a directory: create it (empty) "
            "before the server starts, and set the variable for every worker process"
        )
        logger.error("ratelimits: metrics cannot be served: %s", message)
        return HttpResponse(message + "\n", status=503, content_type="text/plain")
    return HttpResponse(encoder(registry), content_type=content_type)
