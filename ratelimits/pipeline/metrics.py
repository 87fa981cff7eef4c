"""Prometheus metrics: what each policy decided and how long the engine took.

Off unless `RATELIMITS["METRICS"]` is True and `prometheus_client` is installed. Whether
it is on is worked out once per settings value (`recorder_for(config)`), so the request
path pays one identity comparison when it is off and never attempts an import.

The metrics live in prometheus_client's default registry: a site that already exposes
it (django-prometheus, `start_http_server`, a multiprocess collector) gets ours on the
same page, and `ratelimits.urls` serves that registry for a site that does not. With
several worker processes and `PROMETHEUS_MULTIPROC_DIR` set (before the workers start),
prometheus_client writes each worker's values to files there and the view merges them:
one scrape shows the sum of every worker.
"""

from __future__ import annotations

import logging
import os
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


class Recorder:
    """The two metrics and their label children, resolved once per policy and backend."""

    def __init__(self, registry: Any = None) -> None:
        # prometheus_client is optional: imported only once metrics are on
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = REGISTRY if registry is None else registry
        self.requests = Counter(
            "ratelimits_requests",
            "Requests each rate-limit policy decided, by outcome.",
            ["policy", "outcome"],
            registry=registry,
        )
        self.engine_seconds = Histogram(
            "ratelimits_engine_seconds",
            "Latency of the rate-limit engine call made for a request.",
            ["backend"],
            buckets=ENGINE_BUCKETS,
            registry=registry,
        )
        self.adaptive_limit = Gauge(
            "ratelimits_adaptive_limit",
            "Requests in flight an adaptive policy admits in this process, as last learnt.",
            ["policy"],
            registry=registry,
            multiprocess_mode="liveall",  # one series per live worker: sum or average them
        )
        # Plain dicts: a lost race only resolves the same child twice (labels() is locked).
        self._policies: dict[str, tuple[Any, ...]] = {}
        self._backends: dict[type, Any] = {}
        self._learnt: dict[str, Any] = {}

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
            # one server or a cluster (ClusterEngine): both are Redis round trips; the
            # in-process engines (adaptive policies' too) answer without one
            in_process = issubclass(kind, (MemoryEngine, AdaptiveEngine))
            backend = "memory" if in_process else "redis"
            child = self._backends[kind] = self.engine_seconds.labels(backend)
        return child

    def decided(self, engine: object, seconds: float, planned: Iterable[Any],
                decision: Any) -> None:
        """One engine answer: its latency and each policy's outcome (never raises).

        `planned`: (policy, identity) pairs in the order of `decision.results`; each
        result's outcome is the engine's own, the one its per-minute counters record.
        """
        try:
            self._histogram(engine).observe(seconds)
            for (policy, _), result in zip(planned, decision.results, strict=True):
                index = INDEX[result.outcome]
                self._children(policy.name)[index].inc()
        except Exception as exc:
            _failed(exc)

    def learnt(self, name: str, limit: int) -> None:
        """An adaptive policy's limit after a sample (never raises)."""
        try:
            child = self._learnt.get(name)
            if child is None:
                child = self._learnt[name] = self.adaptive_limit.labels(name)
            child.set(limit)
        except Exception as exc:
            _failed(exc)

    def unavailable(self, engine: object, seconds: float, policies: Iterable[Any]) -> None:
        """The store failed: the failed call's latency; each policy's on_error decides."""
        try:
            self._histogram(engine).observe(seconds)
            for policy in policies:
                self._children(policy.name)[UNAVAILABLE].inc()
        except Exception as exc:
            _failed(exc)


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
            _default = Recorder()
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
