"""The route phase: which requests the policies look at, and which glue layer decides
them. An exempt request, one CommonMiddleware redirects, or an admin page asked for by one
of the admin's own users is left alone; a view that decides its own requests (a DRF
throttle, `@ratelimit`) has the middleware leave them to it.

What a method and path ask of a snapshot (its policies, whether the view decides them,
whether the path is the admin's or redirected) is worked out once per snapshot and kept
in it (`route_of`): a request's route is a dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import Resolver404, get_resolver
from django.utils.module_loading import import_string

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.matching.keykinds import KEY_KINDS
from ratelimits.matching.paths import normalize_path
from ratelimits.pipeline.compiled import PER_PROCESS, Snapshot
from ratelimits.pipeline.declared import SCOPES_ATTR
from ratelimits.pipeline.report import log_safe
from ratelimits.pipeline.resolver import resolver
from ratelimits.pipeline.state import Context, RequestState, http_request

logger = logging.getLogger("ratelimits")

#: At most this many routes are kept per snapshot (a site with ids in its URLs has many).
ROUTES_KEPT = 2_048


class Route:
    """What requests of one method and path ask of one snapshot (see `route_of`)."""

    __slots__ = ("admin", "alone", "calls_code", "deferred", "lone", "may_wait",
                 "overridden", "path", "per_process_only", "policies", "reads_user",
                 "redirect", "settles")

    def __init__(self, base: Any, method: str, scopes: frozenset[str], snap: Snapshot) -> None:
        path_info = base.path_info
        #: The path the policies' patterns are matched against.
        self.path = path = normalize_path(path_info)
        as_get = method not in VIEW_NAMED_METHODS and answered_as_get(base)
        #: The policies of `scopes` that look at such a request, most important first.
        self.policies = policies = tuple(snap.matching(path, method, scopes, frozenset(), as_get))
        #: The middleware leaves such a request to the view (`throttle_decides`).
        self.deferred = scopes == UNSCOPED_ROUTE and throttle_decides(base, snap)
        #: The path is under an admin site: whether its user is let in is asked.
        self.admin = under_admin(base)
        #: CommonMiddleware answers it with a redirect to the path with a slash.
        self.redirect = not path_info.endswith("/") and redirects_with_slash(base)
        #: Such a request may be left alone whatever `EXEMPT` says (`left_alone`): other
        #: routes skip the question unless `EXEMPT` is set.
        self.alone = self.redirect or self.admin
        kinds = {p.key_spec.kind for p in policies}
        #: A key reads the user (an async stack loads it first), a key or a cost function
        #: runs code of the user's (an async stack plans in a thread), a policy has
        #: overrides (which may ask the tier, also the user's code).
        self.reads_user = bool(kinds & KEY_KINDS.reads_user)
        self.calls_code = bool(kinds & KEY_KINDS.calls_code) or any(
            p.cost_of is not None for p in policies)
        self.overridden = any(p.overrides is not None for p in policies)
        #: A policy's response may charge or clear the count (`charge_on`, `reset_on`);
        #: a policy may admit with a delay (a place in the waiting room is taken first).
        self.settles = any(p.settles for p in policies)
        self.may_wait = any(p.may_wait for p in policies)
        #: Every policy is decided in the per-process engine (no layer to sort them by);
        #: `lone`: there is one, the request's only layer (nothing to refund it for).
        self.per_process_only = bool(policies) and all(
            p.counting == PER_PROCESS and not p.learned for p in policies)
        self.lone = self.per_process_only and len(policies) == 1


#: The scopes of a request outside DRF: only policies without a scope apply.
UNSCOPED_ROUTE: frozenset[str] = frozenset({""})


def route_of(base: Any, method: str, scopes: frozenset[str], snap: Snapshot) -> Route:
    """The route of `base` (an HttpRequest) for `scopes` on `snap`, worked out at its
    first request. Keyed by the URL resolver too: a URLconf changed in place is seen
    after `clear_url_caches()`, as Django sees it."""
    try:
        urls = get_resolver(getattr(base, "urlconf", None))
    except Exception:  # no URLconf at all (settings without ROOT_URLCONF): none to key by
        urls = None
    key = (urls, base.path_info, method, scopes)
    routes = snap.routes
    route: Route | None = routes.get(key)
    if route is None:
        route = Route(base, method, scopes, snap)
        if len(routes) >= ROUTES_KEPT:
            routes.clear()  # many paths: start again rather than grow
        routes[key] = route
    return route


def asks(ctx: Context, route: Route) -> bool:
    """Whether `left_alone` calls what may block: `EXEMPT`, or the admin's user."""
    state = ctx.state
    return bool((state.exempt is None and ctx.config["EXEMPT"])
                or (state.path is None and route.admin and not ctx.config["LIMIT_ADMIN"]))


def left_alone(ctx: Context, route: Route) -> bool:
    """Whether no policy looks at this request: `EXEMPT` exempts it, CommonMiddleware
    redirects it to its path with a slash (the redirected request is the one charged), or
    it is an admin page asked for by a user the admin lets in (unless `LIMIT_ADMIN`).
    Asked once per request (its state keeps the answer)."""
    state, config = ctx.state, ctx.config
    if state.exempt is None and config["EXEMPT"]:
        is_exempt(ctx.base, state, config)
    if state.exempt:
        return True
    if state.path is None:
        state.path = route.path
        if route.redirect or (route.admin and not config["LIMIT_ADMIN"]
                              and admin_lets_in(ctx.base)):
            state.exempt = True
            return True
    return False


def throttle_decides(request: Any, snap: Snapshot | None = None) -> bool:
    """Whether this request goes to a view that decides it itself: a DRF view whose
    `PolicyThrottle` will (its `throttle_scope` is some policy's scope), or a view with
    `@ratelimit`. The middleware then leaves the request to it, which decides the unscoped
    and the scoped policies in one call (for DRF, after it has authenticated the user that
    `user` keys count). Cheap when no policy has a scope (the URL is resolved only when
    one has)."""
    if snap is None:
        snap = resolver.snapshot()
    if not snap.scopes or not get_config()["ENABLED"]:
        return False
    base = http_request(request)
    view = _view_of(base)
    if view is None:
        return False
    if _declared_scopes(view, base) & snap.scopes:
        return True
    cls = getattr(view, "cls", None)  # DRF's as_view() keeps the view class there
    throttles = getattr(cls, "throttle_classes", ())
    # DRF compat throttles (compat.drf) declare their own limits: the view has some
    if any(getattr(t, "declares_policies", False) for t in throttles):
        return True
    if getattr(cls, "throttle_scope", None) not in snap.scopes:
        return False
    return any(getattr(t, "decides_policies", False) for t in throttles)


#: The methods a view names when it does for them other work than for GET. A view function
#: runs its body whatever the method, and answers any other one (OPTIONS, TRACE, a method
#: of the client's own) as it answers GET: `if request.method == "POST": ... else: ...`.
VIEW_NAMED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})


def answered_as_get(base: Any) -> bool:
    """Whether a request whose method is not in `VIEW_NAMED_METHODS` goes to a view
    function, which runs the body it answers GET with: then a policy on GET counts it.
    A class-based view's `dispatch` answers such a method without its `get` (Django's
    `View` answers OPTIONS itself and refuses the others with a 405), and a path that
    resolves to no view runs none: nothing of GET's to count."""
    view = _view_of(base)
    return view is not None and getattr(view, "view_class", None) is None


#: (URL resolver, path) -> the view the path resolves to (None: none), so a path is
#: resolved once rather than on each request (Django resolves it again for the view).
#: A resolver is built anew when the URLconf changes (`clear_url_caches`, another
#: ROOT_URLCONF): its paths are then looked up afresh.
_views: dict[tuple[Any, str], Any] = {}
_UNSEEN = object()
#: At most this many paths are remembered (a site with ids in its URLs has many).
VIEWS_KEPT = 2_048


def _view_of(base: Any) -> Any:
    """The view function `base`'s path resolves to, None when none does."""
    path = base.path_info
    try:
        urls = get_resolver(getattr(base, "urlconf", None))
        key = (urls, path)
        view = _views.get(key, _UNSEEN)  # one lookup: another thread may clear it
        if view is not _UNSEEN:
            return view
        view = urls.resolve(path).func
    except Resolver404:
        view = None
    except Exception:  # a broken URLconf is Django's to report, not ours to crash on
        logger.exception("ratelimits: could not resolve %s to find its view",
                         log_safe(path))
        return None
    if len(_views) >= VIEWS_KEPT:
        _views.clear()  # many paths: start again rather than grow
    _views[key] = view
    return view


runtime.on_reset(_views.clear)


def _declared_scopes(view: Any, base: Any) -> frozenset[str]:
    """The scopes of the `@ratelimit` limits on a view function, or on a class-based
    view's `dispatch` or method handler (`method_decorator` copies the attribute)."""
    scopes: frozenset[str] = getattr(view, SCOPES_ATTR, frozenset())
    cls = getattr(view, "view_class", None)
    if cls is not None:
        for handler in (getattr(cls, "dispatch", None),
                        getattr(cls, (base.method or "get").lower(), None)):
            scopes = scopes | getattr(handler, SCOPES_ATTR, frozenset())
    return scopes


_COMMON = "django.middleware.common.CommonMiddleware"


def redirects_with_slash(base: Any) -> bool:
    """Whether CommonMiddleware will answer this request with a redirect to `path + "/"`.

    The redirect costs the client nothing: the request it leads to is charged. Any other
    unresolved URL is charged, so scanners probing for pages stay limited.
    """
    from django.conf import settings

    if not settings.APPEND_SLASH or _COMMON not in settings.MIDDLEWARE:
        return False
    from django.middleware.common import CommonMiddleware

    return bool(CommonMiddleware(_no_response).should_redirect_with_slash(base))


def _no_response(request: Any) -> Any:  # CommonMiddleware wants a get_response
    return None


def is_exempt(base: Any, state: RequestState, config: Mapping[str, Any]) -> bool:
    """Whether `RATELIMITS["EXEMPT"]` exempts this request, asked once per request; a
    function that fails is logged and the request not exempt."""
    if state.exempt is None:
        state.exempt = False
        if config["EXEMPT"]:
            try:
                state.exempt = bool(import_string(config["EXEMPT"])(base))
            except runtime.FUNCTION_FAILED:
                logger.exception("ratelimits: the EXEMPT function failed; not exempting")
    return state.exempt


def under_admin(base: Any) -> bool:
    """Whether the request's path is under the prefix of an admin site of its URLconf:
    a string comparison per site, the prefixes found once per URLconf. Only such requests
    are asked `admin_lets_in`, which may load the user."""
    urlconf = getattr(base, "urlconf", None)
    prefixes = _prefixes.get(urlconf)
    if prefixes is None:
        prefixes = _admin_prefixes(urlconf)
    return bool(prefixes) and base.path_info.startswith(prefixes)


#: URLconf (None: ROOT_URLCONF) -> its admin sites' prefixes; read on every request.
_prefixes: dict[Any, tuple[str, ...]] = {}


def _admin_prefixes(urlconf: Any) -> tuple[str, ...]:
    """The path prefix of each admin site (`AdminSite`) in `urlconf` (None: the
    ROOT_URLCONF), without the script prefix (it is matched against `path_info`); none
    without django.contrib.admin. Remembered in `_prefixes`."""
    from django.apps import apps
    from django.conf import settings

    found = []
    # no URLconf at all (settings without ROOT_URLCONF): no admin site is served
    urls = urlconf or getattr(settings, "ROOT_URLCONF", None)
    if urls is not None and apps.is_installed("django.contrib.admin"):
        from django.contrib.admin.sites import all_sites
        from django.urls import NoReverseMatch, get_script_prefix, reverse

        script = get_script_prefix()
        for site in list(all_sites):
            try:
                url = reverse(f"{site.name}:index", urlconf=urls)
            except NoReverseMatch:
                continue  # a site this URLconf does not include
            found.append("/" + url[len(script):] if url.startswith(script) else url)
    _prefixes[urlconf] = prefixes = tuple(found)
    return prefixes


runtime.on_reset(_prefixes.clear)


@receiver(setting_changed, dispatch_uid="ratelimits.routing.urlconf")
def _on_urlconf_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("ROOT_URLCONF", "INSTALLED_APPS"):
        _prefixes.clear()
    if setting in ("ROOT_URLCONF", "INSTALLED_APPS", "APPEND_SLASH", "MIDDLEWARE"):
        resolver.forget_routes()


runtime.on_reset(resolver.forget_routes)


def admin_lets_in(base: Any) -> bool:
    """Whether the request is for a page of an admin site, other than its login page, by a
    user that site lets in (`AdminSite.has_permission`: active staff by default). Such a
    request is left alone by every policy unless `RATELIMITS["LIMIT_ADMIN"]`, so no policy
    can lock the operators out of the admin that would undo it; the login page stays
    limited (it is where passwords are guessed), and so is everyone the admin turns
    away. May load the user: a blocking call. An error is logged and the request limited."""
    from django.contrib.admin.sites import all_sites
    from django.urls import Resolver404, resolve

    try:
        match = resolve(base.path_info, getattr(base, "urlconf", None))
        if "admin" not in match.app_names or match.url_name == "login":
            return False
        # only the site that serves the page is asked: another site's rule is not this one's
        return any(site.name in match.namespaces and site.has_permission(base)
                   for site in list(all_sites))
    except Resolver404:
        return False
    except Exception:  # a site's has_permission, a broken URLconf: Django's to report
        logger.exception("ratelimits: could not tell whether %s is an admin user's page; "
                         "limiting it", log_safe(base.path_info))
        return False
