"""Where each limit declared in code applies: the URL patterns whose view carries its
`@ratelimit`, found by walking the URLconf, for the admin to name them.

A declared policy's scope (`code:<name>`) is on the views it decorates (`SCOPES_ATTR`), on
a class-based view's `dispatch` or method handlers when `method_decorator` put it there.
A decorated view that no URL pattern reaches is not listed: no request can reach it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

from ratelimits.pipeline.declared import SCOPES_ATTR

#: A view's routes shown before "and N more".
SHOWN = 3


@dataclass(frozen=True)
class Route:
    """One URL pattern of a decorated view: `/api/login/` and the view's dotted name."""

    pattern: str
    view: str

    @property
    def view_name(self) -> str:
        """The view's own name, without its module or enclosing functions."""
        return self.view.rsplit(".", 1)[-1]


def declared_routes(urlconf: str | None = None) -> dict[str, list[Route]]:
    """The routes of every decorated view, by declared scope (`code:<name>`), in URLconf
    order. One walk of the URL patterns, no import beyond the URLconf's own."""
    out: dict[str, list[Route]] = {}
    for pattern, view in routed_views(urlconf):
        for scope in sorted(_scopes(view)):
            out.setdefault(scope, []).append(Route(pattern, _dotted(view)))
    return out


def routed_views(urlconf: str | None = None) -> Iterator[tuple[str, Any]]:
    """(route, view) of every URL pattern of the URLconf, in order."""
    return _patterns(get_resolver(urlconf).url_patterns, "/")


def describe(routes: list[Route]) -> tuple[str, str, str]:
    """`routes` for a reader: their paths ("/login/, /signin/"; past `SHOWN`, "and N
    more"), the views' own names ("login") and their dotted names."""
    paths = ", ".join(r.pattern for r in routes[:SHOWN])
    if len(routes) > SHOWN:
        paths += f" and {len(routes) - SHOWN} more"
    names = ", ".join(sorted({r.view_name for r in routes}))
    return paths, names, ", ".join(sorted({r.view for r in routes}))


def _patterns(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry.url_patterns, prefix + _text(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + _text(entry.pattern), entry.callback


def _text(pattern: Any) -> str:
    """A route as written ("login/"), or a regex as a reader sees it ("^login/$" ->
    "login/")."""
    return str(pattern).removeprefix("^").removesuffix("$").removesuffix(r"\Z")


def _scopes(view: Any) -> frozenset[str]:
    """The declared scopes of a view function, or of a class-based view's `dispatch` and
    method handlers (any method: the admin shows every view a limit is on)."""
    scopes: frozenset[str] = getattr(view, SCOPES_ATTR, frozenset())
    cls = getattr(view, "view_class", None)  # as_view() keeps the class there
    if cls is not None:
        for name in ("dispatch", *cls.http_method_names):
            scopes |= getattr(getattr(cls, name, None), SCOPES_ATTR, frozenset())
    return scopes


def _dotted(view: Any) -> str:
    """`accounts.views.login`; a class-based view by its class."""
    target = getattr(view, "view_class", view)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None) or type(target).__module__
    return f"{module}.{name.replace('<locals>.', '')}"
