"""The `RATELIMITS` settings dict: defaults, validation and one cached accessor.

Every setting is one row of `SETTINGS`: its default and a function that checks (and may
normalise) the value, raising `ValueError` with a message that says what to fix. Adding
a setting is adding a row. The accessor is cleared on `setting_changed`, so
`override_settings` works; settings are never read at import time.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

HEADER_STYLES = ("ietf", "legacy", "both", "none")


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be True or False, got {value!r}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _optional_dotted_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or "." not in value:
        raise ValueError(f"must be a dotted import path such as 'myapp.views.f', got {value!r}")
    return value


def _header_style(value: Any) -> str:
    if value not in HEADER_STYLES:
        raise ValueError(f"must be one of {', '.join(HEADER_STYLES)}, got {value!r}")
    return str(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"must be zero or a positive number of seconds, got {value!r}")
    return float(value)


def _ipv6_prefix(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 128:
        raise ValueError(f"must be an integer prefix length from 1 to 128, got {value!r}")
    return value


def _trusted_proxies(value: Any) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"must be a list of IP addresses or CIDRs, got {value!r}")
    if not value:
        return ()
    from ratelimits.pipeline.identity import parse_trusted_proxies

    return tuple(parse_trusted_proxies(value))


def _proxy_header(value: Any) -> str:
    from ratelimits.pipeline.identity import is_header_name

    if not isinstance(value, str) or not is_header_name(value.strip()):
        raise ValueError(
            "must name the one header your trusted proxy sets, as it is sent: "
            "'x-forwarded-for', 'forwarded' (RFC 7239) or e.g. 'x-real-ip'; "
            f"got {value!r}"
        )
    return value.strip().lower()


def _timeout(value: Any) -> float:
    seconds = _seconds(value)
    if not 0 < seconds <= 60:
        raise ValueError(f"must be more than 0 and at most 60 seconds, got {value!r}")
    return seconds


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a positive integer, got {value!r}")
    return value


REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
REDIS_URL_EXAMPLE = "'redis://localhost:6379/0'"

#: Connection options the limiter sets itself on every kind of store: a URL may not loosen
#: them, since a limiter on every request must answer within its timeouts or step aside.
LIMITER_OWNED_OPTIONS = {
    "socket_timeout": "set RATELIMITS['SOCKET_TIMEOUT'] instead",
    "socket_connect_timeout": "set RATELIMITS['CONNECT_TIMEOUT'] instead",
    "retry_on_timeout": "the limiter never retries: a policy's on_error decides instead",
    "retry_on_error": "the limiter never retries: a policy's on_error decides instead",
    "health_check_interval": "the limiter's short timeouts detect a dead connection",
}


@dataclass(frozen=True)
class RedisURL:
    """A checked `RATELIMITS["REDIS_URL"]`: one server, a socket, or a cluster's seeds.

    `options` are redis-py's connection keyword arguments (credentials, db, TLS, socket
    path) as the URL gives them; the limiter adds its own timeouts when it connects.
    """

    url: str = field(repr=False)
    kind: str  # "server", "socket" or "cluster"
    nodes: tuple[tuple[str, int], ...]  # a cluster's seed nodes; () otherwise
    options: Mapping[str, Any] = field(repr=False)

    @property
    def shown(self) -> str:
        """The URL with its password hidden, for messages and logs."""
        return redact_url(self.url)


def redact_url(url: str) -> str:
    """`url` with the password of its user part replaced by ***."""
    return re.sub(r"(://[^/@?#]*?:)[^/@?#]*@", r"\1***@", url)


def _connection_options_allowed(connection_class: type) -> frozenset[str]:
    names: set[str] = {"max_connections"}
    for klass in connection_class.__mro__:
        if "__init__" in vars(klass):
            names.update(inspect.signature(klass.__init__).parameters)  # type: ignore[misc]
    return frozenset(names - {"self", "args", "kwargs"})


def _url_options(url: str, shown: str, query: str, cluster: bool) -> dict[str, Any]:
    """redis-py's keyword arguments for one URL, refusing options it would trip on later."""
    from redis.connection import Connection, parse_url

    try:
        options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"{shown!r}: {exc}") from None
    allowed = _connection_options_allowed(options.get("connection_class", Connection))
    if cluster:
        from redis.cluster import REDIS_ALLOWED_KEYS

        allowed &= frozenset(REDIS_ALLOWED_KEYS)  # RedisCluster drops any other silently
    for name in parse_qs(query, keep_blank_values=True):
        if name in LIMITER_OWNED_OPTIONS:
            raise ValueError(
                f"{shown!r} sets {name}, which the limiter owns: remove it from the URL "
                f"({LIMITER_OWNED_OPTIONS[name]})"
            )
        if name not in allowed or name.startswith(("orig_", "maint")):
            raise ValueError(
                f"{shown!r} has the option {name!r}, which redis-py does not take for this "
                "scheme; check its spelling (e.g. ssl_ca_certs, ssl_cert_reqs, db)"
            )
    return options


def _seed_node(node: str, shown: str) -> tuple[str, int]:
    if not node.strip():
        raise ValueError(
            f"{shown!r} has an empty node in its list: separate host:port pairs with "
            "single commas, e.g. 'redis+cluster://10.0.0.1:7000,10.0.0.2:7000'"
        )
    split = urlsplit(f"//{node}")
    host = split.hostname
    port = _port(split, node, shown)
    if not host:
        raise ValueError(f"{shown!r} has the node {node!r} without a host")
    return host, port or 6379


def _port(split: Any, where: str, shown: str) -> int | None:
    try:
        port = split.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(
            f"{shown!r} has a bad port in {where!r}: a port is a number from 1 to 65535"
        )
    return port  # type: ignore[no-any-return]


def parse_redis_url(value: Any) -> RedisURL | None:
    """Check a `REDIS_URL` value; ValueError with a message that says what to fix."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"must be a URL such as {REDIS_URL_EXAMPLE}, or None to use the CACHE alias; "
            f"got {value!r}"
        )
    shown = redact_url(value)
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in REDIS_SCHEMES:
        found = f"the scheme {scheme!r}" if sep else "no scheme"
        raise ValueError(
            f"{shown!r} has {found}: use redis:// or rediss:// (TLS) for one server, "
            "unix:// for a socket, redis+cluster:// or rediss+cluster:// (TLS) for a "
            f"Redis Cluster, e.g. {REDIS_URL_EXAMPLE}"
        )
    cluster = scheme.endswith("+cluster")
    base = scheme.removesuffix("+cluster")
    split = urlsplit(f"{base}://{rest}")
    if base == "unix":
        if not split.path or split.path == "/":
            raise ValueError(
                f"{shown!r} names no socket: write e.g. 'unix:///run/redis/redis.sock?db=0'"
            )
        options = _url_options(f"{base}://{rest}", shown, split.query, cluster=False)
        return RedisURL(value, "socket", (), MappingProxyType(options))
    if split.path not in ("", "/") and not re.fullmatch(r"/\d+/?", unquote(split.path)):
        raise ValueError(
            f"{shown!r} has the path {split.path!r}: the path is the database number, "
            "e.g. /0, or nothing"
        )
    if not cluster:
        if not split.hostname:
            raise ValueError(f"{shown!r} names no host: write e.g. {REDIS_URL_EXAMPLE}")
        _port(split, split.netloc.rpartition("@")[2], shown)
        options = _url_options(f"{base}://{rest}", shown, split.query, cluster=False)
        return RedisURL(value, "server", (), MappingProxyType(options))
    return _cluster_url(value, shown, split, base)


def _cluster_url(value: str, shown: str, split: Any, base: str) -> RedisURL:
    userinfo, at, hosts = split.netloc.rpartition("@")
    if not hosts.strip():
        raise ValueError(
            f"{shown!r} lists no nodes: write one or more host:port seeds, e.g. "
            "'redis+cluster://10.0.0.1:7000,10.0.0.2:7000'"
        )
    nodes = tuple(_seed_node(node, shown) for node in hosts.split(","))
    first = hosts.split(",")[0]
    single = urlunsplit((base, f"{userinfo}{at}{first}", split.path, split.query, ""))
    options = _url_options(single, shown, split.query, cluster=True)
    if options.get("db", 0) != 0:
        raise ValueError(f"{shown!r} asks for database {options['db']}: a cluster has only 0")
    for name in ("host", "port", "db", "connection_class"):
        options.pop(name, None)
    if base == "rediss":
        options["ssl"] = True
    return RedisURL(value, "cluster", nodes, MappingProxyType(options))


@dataclass(frozen=True)
class Setting:
    default: Any
    check: Callable[[Any], Any]


SETTINGS: dict[str, Setting] = {
    # Global kill switch: False makes the middleware and the throttle pass everything.
    "ENABLED": Setting(True, _boolean),
    # The CACHES alias whose Redis connection the engine uses (unless REDIS_URL is set).
    "CACHE": Setting("default", _string),
    # The engine's own Redis, instead of the CACHE alias: redis://, rediss://, unix:// or
    # redis+cluster://host:port,host:port (parsed into a RedisURL).
    "REDIS_URL": Setting(None, parse_redis_url),
    # Prefix of every key the engine writes; the policy version lives at PREFIX + "version".
    "KEY_PREFIX": Setting("rl:", _string),
    "HEADERS": Setting("ietf", _header_style),
    # view(request, rejection) -> HttpResponse for 429s; None: ratelimits.pipeline.responses.reject.
    "REJECT_VIEW": Setting(None, _optional_dotted_path),
    "TRUSTED_PROXIES": Setting((), _trusted_proxies),
    "IPV6_PREFIX": Setting(64, _ipv6_prefix),
    # The header trusted proxies name the client in; any other is the client's own words.
    "PROXY_HEADER": Setting("x-forwarded-for", _proxy_header),
    # Longest a leaky-bucket request is held before it is served.
    "MAX_DELAY": Setting(5.0, _seconds),
    # Requests that may wait (leaky bucket) at once in one process, and of one client;
    # beyond them a delayed request is refused at once with a 429 rather than wait.
    "MAX_WAITING": Setting(4, _positive_int),
    "MAX_WAITING_PER_CLIENT": Setting(1, _positive_int),
    # exempt(request) -> bool; True skips every policy (health checks, internal probes).
    "EXEMPT": Setting(None, _optional_dotted_path),
    # `tier(request) -> str | None`, e.g. the user's plan: `tier:<name>` overrides apply.
    "TIER": Setting(None, _optional_dotted_path),
    # The engine's own Redis timeouts, independent of the cache's: a limiter must answer
    # fast or step aside (policies then follow their on_error).
    "SOCKET_TIMEOUT": Setting(0.1, _timeout),
    "CONNECT_TIMEOUT": Setting(0.1, _timeout),
    # After this many consecutive store failures, stop calling Redis for BREAKER_COOLDOWN
    # seconds (requests are decided per on_error without touching a socket), then probe.
    "BREAKER_FAILURES": Setting(3, _positive_int),
    "BREAKER_COOLDOWN": Setting(1.0, _timeout),
    # How many app instances share the limits: on_error="local" gives each its share.
    "INSTANCES": Setting(1, _positive_int),
    # Prometheus counters and engine latency (needs prometheus_client; see ops/metrics.py).
    "METRICS": Setting(False, _boolean),
}

_config: Mapping[str, Any] | None = None


def build_config(user: Any) -> Mapping[str, Any]:
    """Validate a user `RATELIMITS` value and fill the defaults; ImproperlyConfigured if bad."""
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        raise ImproperlyConfigured(f"RATELIMITS must be a dict, got {type(user).__name__}")
    unknown = sorted(set(user) - set(SETTINGS))
    if unknown:
        raise ImproperlyConfigured(
            f"unknown RATELIMITS key(s): {', '.join(map(str, unknown))}; "
            f"valid keys are {', '.join(SETTINGS)}"
        )
    values: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        raw = user.get(name, setting.default)
        try:
            values[name] = setting.check(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"RATELIMITS[{name!r}] {exc}") from None
    return MappingProxyType(values)


def get_config() -> Mapping[str, Any]:
    """The validated `RATELIMITS` settings, defaults filled in (cached until settings change)."""
    global _config
    if _config is None:
        _config = build_config(getattr(settings, "RATELIMITS", None))
    return _config


def reset_config() -> None:
    global _config
    _config = None


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "RATELIMITS":
        reset_config()
        from ratelimits.pipeline.resolver import resolver

        resolver.invalidate(None)  # compiled with the old settings (MAX_DELAY)
