"""System checks for what users get wrong when installing ratelimits.

ratelimits.E001  RATELIMITS has an unknown key or a bad value
ratelimits.E002  RateLimitMiddleware is listed before AuthenticationMiddleware
ratelimits.E003  RATELIMITS["CACHE"] names an alias that is not in CACHES
ratelimits.E004  REJECT_VIEW, EXEMPT or TIER cannot be imported
ratelimits.W001  the cache is not Redis (and REDIS_URL is unset): limits are per process
ratelimits.W002  neither the middleware nor the DRF throttle is installed
ratelimits.W003  RATELIMITS["METRICS"] is True but prometheus_client is not installed
ratelimits.W004  an enforced policy limits the admin's pages (GET): an operator it refuses
                 may be kept from signing in (or, with LIMIT_ADMIN, from the whole admin)
                 to undo it (a database check)
ratelimits.W005  an enforced policy makes requests wait for their turn: a worker that
                 serves one request at a time refuses them instead (a database check)
ratelimits.W006  a limit declared in code locks out by a value the client sends: anyone
                 can aim its lockout at someone else (the admin warns of such a policy
                 when it is saved)
ratelimits.I001  TRUSTED_PROXIES is set but PROXY_HEADER is not: say which header the proxy sets
ratelimits.W007  DRF's NUM_PROXIES is set, which the compat throttles do not read (they
                 read the client as the ip key does), and no TRUSTED_PROXIES are
ratelimits.W008  the compat throttles read the client as DRF does (DRF_CLIENT_IP) with
                 NUM_PROXIES unset: X-Forwarded-For is taken from any client
ratelimits.W010  a saved policy cannot run as saved: its call: key or cost function no
                 longer imports, or its period or bucket is past a year (a database check)
ratelimits.E005  RATELIMIT_USE_CACHE (django-ratelimit's) names a cache every process
                 shares that is not Redis: ratelimits would count in each process alone
ratelimits.W009  RATELIMIT_USE_CACHE is set but not read: RATELIMITS names the store
ratelimits.E006  RATELIMITS["DATABASE"] names no DATABASES alias, or one that is not
                 PostgreSQL

The "System checks" page of the documentation (docs/checks.md) says what triggers each one
and how to fix it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string

from ratelimits.conf import (
    STORE_SETTINGS,
    UPSTREAM_CACHE,
    build_config,
    setting_or_default,
    user_settings,
)
from ratelimits.matching.paths import PathPattern, normalize_path
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


def admin_index() -> str | None:
    """The path of the admin's index in the URLconf, or None without an admin."""
    try:
        return reverse("admin:index")
    except NoReverseMatch:
        return None


def locks_out_admin(policy: Any, admin_url: str) -> bool:
    """Whether an enforced, unscoped policy limits GET requests to the admin's index: a
    client it refuses cannot open the admin to undo it."""
    # apps.py imports this module before the app registry is ready: no models at the top
    from ratelimits.models import Mode, split_methods

    if policy.mode != Mode.ENFORCE or policy.scope:
        return False
    methods = split_methods(policy.methods or "")
    if methods and "GET" not in methods:
        return False  # the admin's pages stay open; only its forms are limited
    try:
        return PathPattern(policy.path).matches(normalize_path(admin_url))
    except ValueError:
        return False  # invalid policies are skipped and logged by the resolver


#: What to do about a policy that `locks_out_admin`.
LOCKOUT_HINT = (
    "Narrow its path so it leaves the admin out, or limit it to the methods that matter "
    "(e.g. POST). Signed-in staff pass unless RATELIMITS['LIMIT_ADMIN'] is True (then "
    "spare them with an override or RATELIMITS['EXEMPT']). Locked out: "
    "`manage.py ratelimits reset` forgets a client's count."
)


def limits_admin() -> bool:
    """`RATELIMITS["LIMIT_ADMIN"]`, also while another key is invalid (E001 says so)."""
    return bool(setting_or_default("LIMIT_ADMIN"))


def lockout_message(policy: Any, admin_url: str) -> str:
    head = (f"The enforced policy {policy.name!r} (path {policy.path!r}) limits GET requests "
            f"to the admin ({admin_url})")
    if limits_admin():
        return (f"{head}, its staff included (RATELIMITS['LIMIT_ADMIN'] is True): once it "
                "refuses you, you cannot open the admin to change it.")
    # signed-in staff pass (pipeline.routing.admin_lets_in); the login page does not
    return (f"{head} for everyone but its signed-in staff (RATELIMITS['LIMIT_ADMIN'] is "
            "False): an operator who is signed out, once refused, may be kept from signing "
            "in to change it.")


@checks.register(checks.Tags.database)
def check_admin_lockout(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Enforced policies that `locks_out_admin` (the admin warns as well when one is
    saved). It reads the policies, so it runs as Django's database checks do: with
    `manage.py check --database default` and before `migrate` (a plain `check` or
    `runserver` does not query the database)."""
    if not databases:
        return []
    from ratelimits.models import Mode, Policy  # not at the top: see locks_out_admin

    url = admin_index()
    if url is None:
        return []  # no admin in the URLconf
    try:
        policies = list(Policy.objects.filter(mode=Mode.ENFORCE, scope=""))
    except DatabaseError:
        return []  # not migrated yet
    return [
        checks.Warning(lockout_message(policy, url), hint=LOCKOUT_HINT, obj=policy,
                       id="ratelimits.W004")
        for policy in policies
        if locks_out_admin(policy, url)
    ]


#: What to do about a policy that `makes_requests_wait`.
WAIT_HINT = (
    "Serve with threads (gunicorn -k gthread --threads N) or ASGI (uvicorn) for such "
    "requests to wait. Already threaded or async: silence ratelimits.W005."
)


def makes_requests_wait(policy: Any) -> bool:
    """Whether an enforced policy admits a request early, to wait for its turn (a leaky
    bucket's queue, a `max_wait`)."""
    from ratelimits.models import Mode  # not at the top: see locks_out_admin
    from ratelimits.pipeline.waiting import may_delay

    return bool(policy.mode == Mode.ENFORCE) and may_delay(policy.as_limit("client"))


@checks.register(checks.Tags.database)
def check_waiting_on_sync_workers(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Enforced policies that `makes_requests_wait`: on a worker that serves one request
    at a time their waits would hold the whole worker, so there (pipeline.waiting) such a
    request is refused with its Retry-After. A database check, as W004 is."""
    if not databases:
        return []
    from ratelimits.models import Mode, Policy

    try:
        policies = list(Policy.objects.filter(mode=Mode.ENFORCE))
    except DatabaseError:
        return []  # not migrated yet
    return [
        checks.Warning(
            f"The enforced policy {policy.name!r} makes requests wait for their turn. A "
            "worker that serves one request at a time (gunicorn's default sync worker, "
            "uWSGI without threads: wsgi.multithread is False) would be held whole by "
            "such a wait, so there a request whose turn is not now is refused at once "
            "with its Retry-After, charged nothing.",
            hint=WAIT_HINT, obj=policy, id="ratelimits.W005")
        for policy in policies
        if makes_requests_wait(policy)
    ]


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


# -- lockouts an attacker can aim ------------------------------------------------------


def aims_lockout(policy: Any) -> bool:
    """Whether `policy`'s lockout can be aimed at someone else: its key's value is what
    the client sends, or a function of yours reads the request (it may read such a
    value)."""
    from ratelimits.matching.keykinds import KEY_KINDS, parse_key

    if not policy.lockout:
        return False
    try:
        kind = KEY_KINDS[parse_key(policy.key).kind]
    except ValueError:
        return False  # its own check says what is wrong with the key
    return kind.client_sent or kind.calls_code


def aimed_lockout_message(policy: Any) -> str:
    """The warning for a lockout an attacker can aim at someone else."""
    return (f"Policy {policy.name!r} locks out by {policy.key}, a value the client sends: "
            f"anyone who sends a victim's value (a username) can lock a victim out for "
            f"{policy.lockout} s, as often as they like. Lock out per IP address and count "
            "per username without a lockout (the login recipe in the docs shows the pair).")


#: What to do about a declared limit that `aims_lockout`.
AIMED_HINT = (
    "Set lockout=0 on this @ratelimit and declare a lockout per address (key=\"ip\") "
    "beside it. If the lockout is meant (the value is a secret only its owner sends), "
    "silence ratelimits.W006."
)


@checks.register()
def check_declared_lockouts(app_configs: Any = None, **kwargs: Any
                            ) -> list[checks.CheckMessage]:
    """Limits declared in code (`@ratelimit`) whose lockout `aims_lockout`, as the admin
    warns when an operator saves such a policy. The URLconf is loaded first: the views it
    imports declare their limits as they are imported."""
    from django.urls import get_resolver

    from ratelimits.pipeline.declared import registry

    # Django's own URL check reports a URLconf that fails to load
    with contextlib.suppress(Exception):
        get_resolver().url_patterns  # noqa: B018 - loaded for its views' declarations
    return [
        checks.Warning(f"{aimed_lockout_message(policy)} It is declared in code with "
                       f"@ratelimit(name={policy.name!r}).", hint=AIMED_HINT, obj=policy.name,
                       id="ratelimits.W006")
        for policy in (d.policy() for d in list(registry.declared.values()))
        if aims_lockout(policy)
    ]


# -- saved policies that cannot run as saved --------------------------------------------

#: What the request path does with a saved policy's field that `saved_policy_errors`
#: finds wrong, by field.
_SAVED_EFFECT = {
    "key": "each request it matches is decided by its on_error ({on_error}), with an "
           "ERROR logged each time",
    "cost_function": "each request it matches is charged the policy's cost ({cost}) "
                     "instead, with an ERROR logged",
    "period": "a client it refuses may be told to come back more than a year later",
    "burst": "a client it refuses may be told to come back more than a year later",
}

#: What to do about a policy that `check_saved_policies` reports.
SAVED_HINT = (
    "Change the policy in the admin (it refuses to save it as it is, and says what to "
    "write), or deploy the code it names; `manage.py ratelimits export` shows it whole."
)


@checks.register(checks.Tags.database)
def check_saved_policies(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Policies of the admin's whose row the request path cannot honour
    (`models.saved_policy_errors`): saved before the code they name was renamed or
    removed, or before a bound. A database check, as W004 is: it runs with `manage.py
    check --database default` and before `migrate`, so a deploy that renamed a function
    hears of it."""
    if not databases:
        return []
    from ratelimits.models import Policy, saved_policy_errors  # see locks_out_admin

    try:
        policies = list(Policy.objects.filter(declared=False))  # code declares the others
    except DatabaseError:
        return []  # not migrated yet
    messages: list[checks.CheckMessage] = []
    for policy in policies:
        errors = saved_policy_errors(policy)
        if not errors:
            continue
        wrong = " ".join(
            f"{field}: {' '.join(found)} So {_SAVED_EFFECT[field].format(**vars(policy))}."
            for field, found in errors.items())
        messages.append(checks.Warning(
            f"The policy {policy.name!r} ({policy.mode}) cannot run as saved. {wrong}",
            hint=SAVED_HINT, obj=policy, id="ratelimits.W010"))
    return messages


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
