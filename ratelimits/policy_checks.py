"""System checks of the policies themselves, saved in the admin or declared in code: what
a policy can do that its operator did not mean.

ratelimits.W004  an enforced policy limits the admin's pages (GET): an operator it refuses
                 may be kept from signing in (or, with LIMIT_ADMIN, from the whole admin)
                 to undo it (a database check)
ratelimits.W005  an enforced policy makes requests wait for their turn: a worker that
                 serves one request at a time refuses them instead (a database check)
ratelimits.W006  a limit declared in code locks out by a value the client sends: anyone
                 can aim its lockout at someone else (the admin warns of such a policy
                 when it is saved)
ratelimits.W010  a saved policy cannot run as saved: its call: key or cost function no
                 longer imports, or its period or bucket is past a year (a database check)

`ratelimits.checks` registers them with the settings' checks. The admin asks the same
questions of a policy an operator saves (`locks_out_admin`, `aims_lockout`), with the
same messages.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.core import checks
from django.db import DatabaseError
from django.urls import NoReverseMatch, reverse

from ratelimits.conf import setting_or_default
from ratelimits.matching.paths import PathPattern, normalize_path


def admin_index() -> str | None:
    """The path of the admin's index in the URLconf, or None without an admin."""
    try:
        return reverse("admin:index")
    except NoReverseMatch:
        return None


def locks_out_admin(policy: Any, admin_url: str) -> bool:
    """Whether an enforced, unscoped policy limits GET requests to the admin's index: a
    client it refuses cannot open the admin to undo it."""
    # apps.py imports this module (through ratelimits.checks) before the app registry is
    # ready: no models at the top
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
