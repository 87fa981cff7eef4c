"""System checks for what users get wrong when installing ratelimits.

ratelimits.E001  RATELIMITS has an unknown key or a bad value
ratelimits.E002  RateLimitMiddleware is listed before AuthenticationMiddleware
ratelimits.E003  RATELIMITS["CACHE"] names an alias that is not in CACHES
ratelimits.E004  REJECT_VIEW, EXEMPT or TIER cannot be imported
ratelimits.W001  the cache is not Redis (and REDIS_URL is unset): limits are per process
ratelimits.W002  neither the middleware nor the DRF throttle is installed
ratelimits.W003  RATELIMITS["METRICS"] is True but prometheus_client is not installed
ratelimits.I001  TRUSTED_PROXIES is set but PROXY_HEADER is not: say which header the proxy sets
ratelimits.W007  DRF's NUM_PROXIES is set, which the compat throttles do not read (they
                 read the client as the ip key does), and no TRUSTED_PROXIES are
ratelimits.W008  the compat throttles read the client as DRF does (DRF_CLIENT_IP) with
                 NUM_PROXIES unset: X-Forwarded-For is taken from any client
ratelimits.E005  RATELIMIT_USE_CACHE (django-ratelimit's) names a cache every process
                 shares that is not Redis: ratelimits would count in each process alone
ratelimits.W009  RATELIMIT_USE_CACHE is set but not read: RATELIMITS names the store
ratelimits.E006  RATELIMITS["DATABASE"] names no DATABASES alias, or one that is not
                 PostgreSQL

W004, W005, W006 and W010, the checks of the policies themselves, are in
`ratelimits.policy_checks`; this module registers them with its own. The "System checks"
page of the documentation (docs/checks.md) says what triggers each one and how to fix it.
"""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ratelimits import policy_checks  # noqa: F401  (registers the checks of policies)
from ratelimits.conf import (
    STORE_SETTINGS,
    UPSTREAM_CACHE,
    build_config,
    setting_or_default,
    user_settings,
)
from ratelimits.pipeline.engines import cache_backend, is_redis_backend, postgres_conninfo
from ratelimits.pipeline.metrics import available

MIDDLEWARE = "ratelimits.middleware.RateLimitMiddleware"
THROTTLE = "ratelimits.throttling.PolicyThrottle"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        config = build_config(user_settings())
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix RATELIMITS in your settings; every key, its default and its values "
                "are on the \"Settings\" page of the documentation (docs/settings.md).",
                id="ratelimits.E001",
            )
        ]
    messages: list[checks.CheckMessage] = []
    if config["TRUSTED_PROXIES"] and "PROXY_HEADER" not in (settings.RATELIMITS or {}):
        messages.append(
            checks.Info(
                "RATELIMITS['TRUSTED_PROXIES'] is set but PROXY_HEADER is not: the client "
                "address is read from X-Forwarded-For only, and Forwarded is ignored.",
                hint="Set RATELIMITS['PROXY_HEADER'] to the header your proxy sets: "
                "'x-forwarded-for', 'forwarded' or e.g. 'x-real-ip'.",
                id="ratelimits.I001",
            )
        )
    for name in ("REJECT_VIEW", "EXEMPT", "TIER"):
        if config[name]:
            try:
                import_string(config[name])
            except ImportError as exc:
                messages.append(
                    checks.Error(
                        f"RATELIMITS[{name!r}] = {config[name]!r} cannot be imported: {exc}",
                        hint="Give the dotted path of a function, e.g. 'myapp.views.too_many'.",
                        id="ratelimits.E004",
                    )
                )
    if config["METRICS"] and not available():
        messages.append(
            checks.Warning(
                "RATELIMITS['METRICS'] is True but prometheus_client is not installed: "
                "no metrics are recorded and the metrics view answers 404.",
                hint='pip install "django-ratelimits[prometheus]"',
                id="ratelimits.W003",
            )
        )
    if any(config[name] is not None for name in STORE_SETTINGS):
        # a store of the limiter's own (STORE, REDIS_URL, or DATABASE: `check_database`):
        # CACHE is not used, and limits are shared
        return messages
    alias = config["CACHE"]
    backend = cache_backend(alias)
    named = "RATELIMITS['CACHE']"
    if alias == getattr(settings, UPSTREAM_CACHE, None) and "CACHE" not in (
            getattr(settings, "RATELIMITS", None) or {}):
        named = f"{UPSTREAM_CACHE} (read as RATELIMITS['CACHE'])"
        if _shared_elsewhere(backend):
            return messages  # ratelimits.E005 says what to write instead
    if backend is None:
        messages.append(
            checks.Error(
                f"{named} is {alias!r}, which is not an alias in CACHES.",
                hint="Name one of your CACHES aliases, ideally a django-redis one.",
                id="ratelimits.E003",
            )
        )
    elif not is_redis_backend(backend):
        messages.append(
            checks.Warning(
                f"The cache {alias!r} ({backend}) is not Redis: rate limits are kept in each "
                "process, so every worker counts on its own and limits multiply.",
                hint="Point RATELIMITS['CACHE'] at a django-redis (or Django RedisCache) alias "
                "for limits shared by every process; fine for development.",
                id="ratelimits.W001",
            )
        )
    return messages


def ensure_valid() -> None:
    """Raise ImproperlyConfigured if `check_settings` or `check_database` finds an error
    in RATELIMITS.

    Servers (gunicorn, uWSGI, uvicorn, daphne) never run the system checks, so the
    middleware calls this when the server builds its handler: a mistake stops the app at
    start-up instead of switching enforcement off for every request.
    """
    errors = [m for m in (*check_settings(), *check_database()) if m.is_serious()]
    if errors:
        raise ImproperlyConfigured(
            "; ".join(f"{m.msg} ({m.id}: {m.hint})" if m.hint else f"{m.msg} ({m.id})"
                      for m in errors)
        )


@checks.register()
def check_installation(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    messages: list[checks.CheckMessage] = []
    if (
        MIDDLEWARE in middleware
        and AUTH_MIDDLEWARE in middleware
        and middleware.index(MIDDLEWARE) < middleware.index(AUTH_MIDDLEWARE)
    ):
        messages.append(
            checks.Error(
                f"{MIDDLEWARE} comes before {AUTH_MIDDLEWARE}: policies keyed on the "
                "user would see every request as anonymous.",
                hint=f"Move {MIDDLEWARE} below {AUTH_MIDDLEWARE} in MIDDLEWARE.",
                id="ratelimits.E002",
            )
        )
    rest = getattr(settings, "REST_FRAMEWORK", None) or {}
    throttles = list(rest.get("DEFAULT_THROTTLE_CLASSES", ()) or ())
    if MIDDLEWARE not in middleware and THROTTLE not in throttles:
        messages.append(
            checks.Warning(
                "ratelimits is installed but neither its middleware nor its DRF throttle is: "
                "the policies without a scope apply to no request, and only views that carry "
                "@ratelimit or a throttle of ratelimits in their throttle_classes are limited.",
                hint=f"Add {MIDDLEWARE!r} to MIDDLEWARE, or {THROTTLE!r} to "
                "REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES']; silence ratelimits.W002 if only "
                "such views are to be limited (see docs/checks.md).",
                id="ratelimits.W002",
            )
        )
    return messages


COMPAT_DRF = "ratelimits.compat.drf"


def _compat_drf_in_use(rest: Any) -> bool:
    """Whether a throttle of `ratelimits.compat.drf` may run: named in the settings, or
    imported (the URLconf, which the checks load, imports the views that list one)."""
    named = list(rest.get("DEFAULT_THROTTLE_CLASSES", ()) or ())
    return COMPAT_DRF in sys.modules or any(
        isinstance(c, str) and c.startswith(COMPAT_DRF + ".") for c in named)


@checks.register()
def check_drf_client_ip(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Where the compat throttles and DRF's `NUM_PROXIES` would count clients apart."""
    rest = getattr(settings, "REST_FRAMEWORK", None) or {}
    if not isinstance(rest, dict) or not _compat_drf_in_use(rest):
        return []
    num_proxies = rest.get("NUM_PROXIES")
    if setting_or_default("DRF_CLIENT_IP") == "num_proxies":
        if num_proxies is not None:
            return []
        return [checks.Warning(
            "RATELIMITS['DRF_CLIENT_IP'] is 'num_proxies' and REST_FRAMEWORK['NUM_PROXIES'] "
            "is not set: as DRF does then, ratelimits.compat.drf's throttles take the "
            "client from X-Forwarded-For whoever sends it, so a client that writes another "
            "address in it on every request is never throttled.",
            hint="Set REST_FRAMEWORK['NUM_PROXIES'] to the number of proxies in front of "
            "the app, or remove DRF_CLIENT_IP and set RATELIMITS['TRUSTED_PROXIES'] to "
            "their addresses (the default reads the client as the ip key does).",
            id="ratelimits.W008")]
    if num_proxies is None or setting_or_default("TRUSTED_PROXIES"):
        return []
    return [checks.Warning(
        f"REST_FRAMEWORK['NUM_PROXIES'] is {num_proxies!r}, which ratelimits.compat.drf's "
        "throttles do not read: they count an anonymous client by the address the ip key "
        "reads, from a forwarding header only when the peer is one of "
        "RATELIMITS['TRUSTED_PROXIES'], and none is set, so every client behind your "
        "proxies is counted as one.",
        hint="Set RATELIMITS['TRUSTED_PROXIES'] to your proxies' addresses (and "
        "PROXY_HEADER to the header they set); or set RATELIMITS['DRF_CLIENT_IP'] = "
        "'num_proxies' to count clients as DRF's get_ident() does.",
        id="ratelimits.W007")]


# -- django-ratelimit's RATELIMIT_USE_CACHE ------------------------------------------------

#: Caches that keep their entries in each process, as ratelimits' in-process engine does:
#: django-ratelimit counted per process on them too.
_PER_PROCESS_CACHES = ("django.core.cache.backends.locmem.", "django.core.cache.backends.dummy.")


def _shared_elsewhere(backend: str | None) -> bool:
    """Whether a cache `backend` is shared by every process but is not Redis (memcached,
    the database, files): django-ratelimit counted there for every process, ratelimits
    cannot."""
    return backend is not None and not is_redis_backend(backend) and not backend.startswith(
        _PER_PROCESS_CACHES)


@checks.register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`RATELIMITS['DATABASE']`: a PostgreSQL alias of DATABASES, or a postgresql:// URL."""
    try:
        database = build_config(user_settings())["DATABASE"]
    except ImproperlyConfigured:
        return []  # ratelimits.E001
    if database is None:
        return []
    try:
        postgres_conninfo(database)
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="See the PostgreSQL section of docs/scale-out.md.",
                             id="ratelimits.E006")]
    return []


@checks.register()
def check_upstream_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """django-ratelimit's `RATELIMIT_USE_CACHE`: read as `RATELIMITS['CACHE']` where it
    counts as upstream did (a Redis cache, or a per-process one); else what to write."""
    alias = getattr(settings, UPSTREAM_CACHE, None)
    if alias is None:
        return []
    own: Any = getattr(settings, "RATELIMITS", None) or {}
    if not isinstance(own, dict):
        return []  # ratelimits.E001
    named = next((name for name in STORE_SETTINGS if own.get(name) is not None), None)
    if named is not None or own.get("CACHE", alias) != alias:
        store = (f"RATELIMITS[{named!r}]" if named is not None
                 else f"RATELIMITS['CACHE'] = {own['CACHE']!r}")
        return [checks.Warning(
            f"{UPSTREAM_CACHE} = {alias!r} is not read: {store} is where ratelimits counts.",
            hint=f"Remove {UPSTREAM_CACHE} once django-ratelimit itself is gone, or set "
            f"RATELIMITS['CACHE'] = {alias!r} to count there.",
            id="ratelimits.W009",
        )]
    backend = cache_backend(alias)
    if _shared_elsewhere(backend):
        return [checks.Error(
            f"{UPSTREAM_CACHE} = {alias!r} names a {backend} cache: django-ratelimit "
            "counted there for every process, but ratelimits counts only in Redis, so each "
            "process would count on its own and the limits would multiply.",
            hint="Write RATELIMITS = {'CACHE': '<an alias of a django-redis or Django "
            "RedisCache cache>'} (or {'REDIS_URL': 'redis://host:6379/0'}) and remove "
            f"{UPSTREAM_CACHE}.",
            id="ratelimits.E005",
        )]
    return []
