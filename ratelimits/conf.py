"""The `RATELIMITS` settings dict: defaults, validation and one cached accessor.

Every setting is one row of `SETTINGS`: its default and a function that checks (and may
normalise) the value, raising `ValueError` with a message that says what to fix. Adding
a setting is adding a row. The accessor is cleared on `setting_changed`, so
`override_settings` works; settings are never read at import time. The "Settings" page of
the documentation (docs/settings.md) describes every key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimits.engine.deployments import parse_redis_url
from ratelimits.engine.keynames import CLOCKS
from ratelimits.engine.stores import StoreURL, store_url
from ratelimits.matching.identity import is_header_name, parse_trusted_proxies
from ratelimits.runtime import on_reset

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


#: The longest MAX_DELAY: a request held longer meets the proxies in front of the app
#: (nginx's proxy_read_timeout, most load balancers' idle timeout: 60 s), which give up
#: on it after it was charged.
MAX_DELAY_MOST = 60.0


def _max_delay(value: Any) -> float:
    seconds = _seconds(value)
    if seconds > MAX_DELAY_MOST:
        raise ValueError(f"must be at most {MAX_DELAY_MOST:g} seconds, got {value!r}: a "
                         "request held longer is cut off by the proxies in front of the "
                         "app (nginx and most load balancers give up after 60 s)")
    return seconds


def _ipv6_prefix(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 128:
        raise ValueError(f"must be an integer prefix length from 1 to 128, got {value!r}")
    return value


def _trusted_proxies(value: Any) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"must be a list of IP addresses or CIDRs, got {value!r}")
    if not value:
        return ()
    return tuple(parse_trusted_proxies(value))


def _proxy_header(value: Any) -> str:
    if not isinstance(value, str) or not is_header_name(value.strip()):
        raise ValueError(
            "must name the one header your trusted proxy sets, as it is sent: "
            "'x-forwarded-for', 'forwarded' (RFC 7239) or e.g. 'x-real-ip'; "
            f"got {value!r}"
        )
    return value.strip().lower()


#: How `ratelimits.compat.drf` reads the client address: as the `ip` key does, or as
#: DRF's own `get_ident()` does (its NUM_PROXIES).
DRF_CLIENT_IP_CHOICES = ("trusted_proxies", "num_proxies")


def _drf_client_ip(value: Any) -> str:
    if value not in DRF_CLIENT_IP_CHOICES:
        raise ValueError(
            "must be 'trusted_proxies' (the client as TRUSTED_PROXIES and PROXY_HEADER "
            "say, as the ip key reads it) or 'num_proxies' (DRF's get_ident() and its "
            f"NUM_PROXIES); got {value!r}"
        )
    return str(value)


def _timeout(value: Any) -> float:
    seconds = _seconds(value)
    if not 0 < seconds <= 60:
        raise ValueError(f"must be more than 0 and at most 60 seconds, got {value!r}")
    return seconds


def _clock(value: Any) -> str:
    if value not in CLOCKS:
        raise ValueError(
            f"must be one of {', '.join(map(repr, CLOCKS))}, got {value!r}: \"store\" reads "
            "the store's clock in its scripts, \"client\" sends each process's own (for a "
            "managed Redis that refuses TIME in scripts)")
    return str(value)


def _database(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a DATABASES alias or a postgresql:// URL, got {value!r}")
    if "://" in value and not value.startswith(("postgresql://", "postgres://")):
        raise ValueError(f"a URL here must be postgresql:// (or postgres://), got "
                         f"{value.split('://', 1)[0]}://; a Redis URL goes in REDIS_URL")
    return value


def _store(value: Any) -> StoreURL | None:
    return None if value is None else store_url(value)


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Setting:
    default: Any
    check: Callable[[Any], Any]


SETTINGS: dict[str, Setting] = {
    # Global kill switch: False makes the middleware and the throttle pass everything.
    "ENABLED": Setting(True, _boolean),
    # The CACHES alias whose Redis connection the engine uses (unless REDIS_URL is set).
    "CACHE": Setting("default", _string),
    # The engine's own Redis, instead of the CACHE alias: a URL of one of the schemes of
    # `engine.deployments` (parsed into a RedisURL).
    "REDIS_URL": Setting(None, parse_redis_url),
    # PostgreSQL instead of Redis, for sites without Redis: a DATABASES alias (the engine
    # opens connections of its own from its settings) or a postgresql:// URL.
    "DATABASE": Setting(None, _database),
    # Any store by the scheme of its URL (`engine.stores`): Redis's schemes, postgresql://,
    # or one a registered store answers to.
    "STORE": Setting(None, _store),
    # Prefix of every key the engine writes; the policy version lives at PREFIX + "version".
    "KEY_PREFIX": Setting("rl:", _string),
    "HEADERS": Setting("ietf", _header_style),
    # view(request, rejection) -> HttpResponse for 429s and 503s; None:
    # ratelimits.pipeline.responses.reject.
    "REJECT_VIEW": Setting(None, _optional_dotted_path),
    "TRUSTED_PROXIES": Setting((), _trusted_proxies),
    "IPV6_PREFIX": Setting(64, _ipv6_prefix),
    # The header trusted proxies name the client in; any other is the client's own words.
    "PROXY_HEADER": Setting("x-forwarded-for", _proxy_header),
    # The address ratelimits.compat.drf counts an anonymous client by: "trusted_proxies"
    # (the `ip` key's) or "num_proxies" (DRF's get_ident(), which with NUM_PROXIES unset
    # takes X-Forwarded-For from anyone).
    "DRF_CLIENT_IP": Setting("trusted_proxies", _drf_client_ip),
    # Longest a request is held for its turn (a leaky bucket's queue, a policy's max_wait).
    "MAX_DELAY": Setting(5.0, _max_delay),
    # Requests that may wait for their turn at once in one process, and of one client;
    # beyond them a delayed request is refused at once with a 429 rather than wait.
    "MAX_WAITING": Setting(4, _positive_int),
    "MAX_WAITING_PER_CLIENT": Setting(1, _positive_int),
    # exempt(request) -> bool; True skips every policy (health checks, internal probes).
    "EXEMPT": Setting(None, _optional_dotted_path),
    # `tier(request) -> str | None`, e.g. the user's plan: `tier:<name>` overrides apply.
    "TIER": Setting(None, _optional_dotted_path),
    # False: the requests an admin site serves to its own users (signed-in staff), its
    # login page aside, are left alone by every policy, so no policy locks its operators
    # out of the admin that would undo it. True: the admin is limited like any path.
    "LIMIT_ADMIN": Setting(False, _boolean),
    # The engine's own Redis timeouts, independent of the cache's: a limiter must answer
    # fast or step aside (policies then follow their on_error). Half a second: a local or
    # LAN Redis answers in a millisecond, but on a machine whose cores are all busy the
    # server waits its turn to run for tens of milliseconds, and a fork for a snapshot
    # stalls it for more; 0.1 s ran out there, and on_error="allow" admitted past the
    # limit. A dead store costs this wait only until the breaker opens (BREAKER_FAILURES
    # calls per process), then once per cool-down; docs/settings.md says more.
    "SOCKET_TIMEOUT": Setting(0.5, _timeout),
    "CONNECT_TIMEOUT": Setting(0.5, _timeout),
    # After this many consecutive store failures, stop calling Redis for BREAKER_COOLDOWN
    # seconds (requests are decided per on_error without touching a socket), then probe.
    "BREAKER_FAILURES": Setting(3, _positive_int),
    "BREAKER_COOLDOWN": Setting(1.0, _timeout),
    # How many app instances share the limits: on_error="local" gives each its share.
    "INSTANCES": Setting(1, _positive_int),
    # Whose clock decides a call: "store" (the scripts read the store's TIME: one clock
    # for every process) or "client" (each process sends its own, for a managed Redis that
    # refuses TIME in scripts; the processes' clocks must agree, see docs/settings.md).
    "CLOCK": Setting("store", _clock),
    # Prometheus counters and engine latency (needs prometheus_client; see pipeline/metrics.py).
    "METRICS": Setting(False, _boolean),
}

#: The settings that name the store the limits live in: at most one may be set.
STORE_SETTINGS = ("STORE", "REDIS_URL", "DATABASE")

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
    named = [name for name in STORE_SETTINGS if values[name] is not None]
    if len(named) > 1:
        raise ImproperlyConfigured(
            f"RATELIMITS sets {' and '.join(named)}: the limits live in one store; keep "
            "one of them (STORE takes any store's URL, REDIS_URL a Redis one, DATABASE "
            "a DATABASES alias or a postgresql:// URL).")
    return MappingProxyType(values)


#: django-ratelimit's setting naming the cache it counts in. A site migrating from it
#: keeps its limits on that cache: it is `CACHE` when RATELIMITS sets neither `CACHE` nor
#: `REDIS_URL` (the checks refuse it where that would not count as upstream did).
UPSTREAM_CACHE = "RATELIMIT_USE_CACHE"


def user_settings() -> Any:
    """`settings.RATELIMITS` as the site gives it, with `RATELIMIT_USE_CACHE` as its
    `CACHE` when it sets neither `CACHE` nor `REDIS_URL`."""
    user: Any = getattr(settings, "RATELIMITS", None)
    upstream = getattr(settings, UPSTREAM_CACHE, None)
    if upstream is None or not isinstance(user, Mapping | None):
        return user
    if user is not None and ("CACHE" in user or any(name in user for name in STORE_SETTINGS)):
        return user
    return {**(user or {}), "CACHE": upstream}


def get_config() -> Mapping[str, Any]:
    """The validated `RATELIMITS` settings, defaults filled in (cached until settings change)."""
    global _config
    if _config is None:
        _config = build_config(user_settings())
    return _config


def setting_or_default(name: str) -> Any:
    """`RATELIMITS[name]`, even while another key of `RATELIMITS` is invalid; its default
    when this one is missing or invalid too. For what must not raise on a settings
    mistake: validating a policy declared in code (its module is imported by
    `manage.py check` before the check reports the mistake as E001) and the check's own
    messages. The request path reads `get_config()`, which raises."""
    try:
        return get_config()[name]
    except ImproperlyConfigured:
        pass
    setting = SETTINGS[name]
    user = user_settings()
    try:
        return setting.check(user[name])
    except (TypeError, KeyError, ValueError):  # not a dict, not set, or not valid
        return setting.default


def time_zone() -> str:
    """The zone calendar windows follow: `settings.TIME_ZONE` (UTC when it is None)."""
    return getattr(settings, "TIME_ZONE", None) or "UTC"


@on_reset
def reset_config() -> None:
    """Forget the validated settings: the next `get_config()` reads them again."""
    global _config
    _config = None


@receiver(setting_changed)
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RATELIMITS", UPSTREAM_CACHE):
        reset_config()
