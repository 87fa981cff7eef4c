"""Where the limits declared in code apply, as the admin names them."""

from __future__ import annotations

from ratelimits.ops.routes import Route, describe


def test_a_view_on_many_urls_is_named_once_and_its_urls_cut_short():
    routes = [Route(f"/v{i}/", "shop.views.Search") for i in range(5)]
    routes.append(Route("/login/", "accounts.views.login"))
    assert describe(routes) == ("/v0/, /v1/, /v2/ and 3 more", "Search, login",
                                "accounts.views.login, shop.views.Search")
