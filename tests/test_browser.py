"""Observe, then enforce, as an operator does it: a real Chromium drives the admin.

Debian's Chromium (`make test` installs it) is driven by Playwright for Python through
its executable path; Playwright's own browser download is never used. The window is
1,400 px wide, a laptop's, with the admin's navigation open. Screenshots go to a
temporary directory, or to `RATELIMITS_SCREENSHOTS` (`make screenshots` sets it to
docs/img, the pictures the README and the docs show).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
import types
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
# The machine's network is closed: keep Chromium from reaching out at start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


#: The window's width: a laptop's screen.
WIDTH = 1400


@pytest.fixture
def browser_page(monkeypatch):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: `make test` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls made here
    # (fixtures, assertions) are plain synchronous calls all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        try:
            yield page
        finally:
            browser.close()


def log_in(page, base: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


@pytest.fixture
def shots(tmp_path) -> Path:
    target = os.environ.get("RATELIMITS_SCREENSHOTS")
    path = Path(target) if target else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.slow
def test_observe_in_shadow_then_enforce_from_the_admin(
    live_server, browser_page, shots, django_user_model
):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    page, base = browser_page, live_server.url

    log_in(page, base)

    # a new policy: shadow is the default mode, nothing is refused yet
    page.goto(f"{base}/admin/ratelimits/policy/add/")
    assert page.locator("#id_mode").input_value() == "shadow"
    page.fill("#id_name", "hello-shadow")
    page.select_option("#id_algorithm", "sliding_log")  # exact, no window edge
    page.fill("#id_limit", "3")
    page.fill("#id_period", "3600")
    page.fill("#id_key", "ip")
    page.fill("#id_path", "/hello/")
    page.click("input[name=_save]")
    assert "was added successfully" in page.locator(".messagelist").inner_text()

    statuses = [page.request.get(f"{base}/hello/").status for _ in range(7)]
    assert statuses == [200] * 7  # shadow: every request passes

    page.goto(f"{base}/admin/ratelimits/policy/")
    row = page.locator("#result_list tbody tr", has_text="hello-shadow")
    hour = row.locator("td.field-last_hour")
    assert hour.locator(".rl-admitted").inner_text() == "3"
    assert hour.locator(".rl-would-reject").inner_text() == "4"
    assert hour.locator(".rl-share").inner_text() == "57.1%"
    assert lines_of(hour) <= 2, hour.inner_text()
    page.locator("#content").screenshot(path=str(shots / "policy-list.png"))

    row.locator("th a").click()
    assert page.locator("#rl-would-reject").inner_text() == "4"
    assert page.locator("#rl-admitted").inner_text() == "3"
    assert page.locator("svg.rl-chart").count() == 2
    assert page.locator("#rl-offenders").inner_text().count("ip:127.0.0.1") == 1
    page.locator("#observe").screenshot(path=str(shots / "policy-page.png"))

    # enforce it with the admin action: the next request is refused
    page.goto(f"{base}/admin/ratelimits/policy/")
    row = page.locator("#result_list tbody tr", has_text="hello-shadow")
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "switch_to_enforce")
    page.click("button[name=index]")
    assert "Switched to enforce: hello-shadow" in page.locator(".messagelist").inner_text()
    response = page.request.get(f"{base}/hello/")
    assert response.status == 429
    assert int(response.headers["retry-after"]) >= 1

    page.goto(f"{base}/admin/ratelimits/policy/dashboard/")
    assert page.locator("svg.rl-spark").count() == 1
    page.locator("#content").screenshot(path=str(shots / "dashboard.png"))


@pytest.mark.slow
def test_an_adaptive_policy_from_the_form_to_its_charts(
    live_server, browser_page, shots, django_user_model
):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    page, base = browser_page, live_server.url
    log_in(page, base)

    page.goto(f"{base}/admin/ratelimits/policy/add/")
    page.fill("#id_name", "hello-adaptive")
    page.select_option("#id_mode", "enforce")
    page.select_option("#id_algorithm", "adaptive")
    page.fill("#id_limit", "16")
    page.fill("#id_floor", "20")  # above the limit: refused, with what to fix
    page.fill("#id_key", "ip")  # per client: refused too
    page.fill("#id_path", "/hello/")
    page.click("input[name=_save]")
    page.locator(".errornote").wait_for()  # the form again, with what to fix
    errors = page.locator(".errorlist").all_inner_texts()
    assert any("set the key to global" in e for e in errors), errors
    assert any("Floor must be an integer from 1 to the limit (16)" in e for e in errors), errors
    page.fill("#id_floor", "2")
    page.fill("#id_key", "global")
    page.click("input[name=_save]")
    assert "was added successfully" in page.locator(".messagelist").inner_text()

    statuses = [page.request.get(f"{base}/hello/").status for _ in range(5)]
    assert statuses == [200] * 5  # one at a time: always within the learnt limit

    page.goto(f"{base}/admin/ratelimits/policy/")
    page.locator("#result_list tbody tr", has_text="hello-adaptive").locator("th a").click()
    learnt = page.locator("#rl-learnt").inner_text()  # waits for the page
    assert "requests in flight per process" in learnt and "over 5 requests" in learnt
    assert page.locator("svg.rl-chart").count() == 4  # requests (hour, day), limit, latency
    assert page.locator("polyline.rl-mean_limit").count() == 1
    assert page.locator("#overrides-group").count() == 0  # it takes no overrides
    page.locator("#observe").screenshot(path=str(shots / "policy-adaptive.png"))


@pytest.mark.slow
def test_the_policy_list_fits_a_laptop_screen_beside_the_navigation(
    live_server, browser_page, django_user_model, make_policy
):
    """At 1300 px, with the admin's navigation open and the filters beside it, every
    column of the list is on screen: no scrolling sideways to reach the figures."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    make_policy(name="login-attempts-per-key", algorithm="token_bucket", limit=1000,
                period=600, burst=200, key="header:X-Api-Key",
                path="/api/v1/accounts/*/login/", methods="POST,PUT", scope="logins")
    make_policy(name="everyone", mode="shadow", algorithm="sliding_window", limit=100000,
                period=60, key="global", path="/api/**")
    page, base = browser_page, live_server.url
    page.set_viewport_size({"width": 1300, "height": 800})
    log_in(page, base)
    page.goto(f"{base}/admin/ratelimits/policy/")
    # the admin's script opens the sidebar once the page has loaded: wait for it (an
    # error if it never opens)
    page.locator("#nav-sidebar").wait_for(state="visible", timeout=5000)
    box = page.evaluate("""() => {
        const table = document.querySelector('#result_list');
        const wrapper = table.parentElement;
        const last = table.querySelector('thead th:last-child').getBoundingClientRect();
        return {scroll: wrapper.scrollWidth, client: wrapper.clientWidth,
                last: last.right, edge: wrapper.getBoundingClientRect().right};
    }""")
    assert box["scroll"] <= box["client"], box
    assert box["last"] <= box["edge"] + 0.5, box
    assert page.locator("th", has_text="last hour").is_visible()


@pytest.mark.slow
def test_overrides_and_a_gradual_rollout_from_the_admin(
    live_server, browser_page, shots, django_user_model, make_policy
):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    policy = make_policy(name="api-per-ip", limit=100, period=60, path="/hello/",
                         rollout=5, description="New rule, rolled out to a few clients.")
    page, base = browser_page, live_server.url
    log_in(page, base)

    # an override, added inline on the policy's page
    page.goto(f"{base}/admin/ratelimits/policy/{policy.pk}/change/")
    page.locator("#overrides-group .add-row a").click()
    page.fill("#id_overrides-0-match", "ip:192.0.2.10")
    page.fill("#id_overrides-0-limit", "1000")
    page.fill("#id_overrides-0-note", "Partner gateway, ticket 4711")
    page.locator("#overrides-group .add-row a").click()
    page.fill("#id_overrides-1-match", "ip:10.0.0.0/8")
    page.check("#id_overrides-1-exempt")
    page.fill("#id_overrides-1-note", "Office network")
    page.click("input[name=_continue]")
    assert "was changed successfully" in page.locator(".messagelist").inner_text()
    assert_inline_fits(page)
    page.locator("#overrides-group").screenshot(path=str(shots / "policy-overrides.png"))

    # every override, across policies
    page.goto(f"{base}/admin/ratelimits/override/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    assert "1000 per minute" in rows.filter(has_text="192.0.2.10").inner_text()
    assert "exempt" in rows.filter(has_text="10.0.0.0/8").inner_text()
    page.locator("#content").screenshot(path=str(shots / "override-list.png"))

    # the rollout, raised a step from the list
    page.goto(f"{base}/admin/ratelimits/policy/")
    row = page.locator("#result_list tbody tr", has_text="api-per-ip")
    assert "5% of clients" in row.inner_text()
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "raise_rollout")
    page.click("button[name=index]")
    assert "Rollout raised: api-per-ip (25%)" in page.locator(".messagelist").inner_text()
    row = page.locator("#result_list tbody tr", has_text="api-per-ip")
    assert "25% of clients" in row.inner_text()
    page.locator("#content").screenshot(path=str(shots / "policy-rollout.png"))



# -- the pictures of the docs ---------------------------------------------------------------


@pytest.fixture
def busy_site(settings, forget_declarations, make_policy):
    """A site a day into its limits: a login view with @ratelimit, an API, a search page
    watched in shadow, an adaptive backend, an upload queue rolled out to a quarter of
    its clients; each with a day of figures as the engine counts them."""
    from django.contrib import admin
    from django.http import HttpResponse
    from django.urls import path

    from ratelimits.decorators import ratelimit
    from ratelimits.models import Override
    from ratelimits.pipeline.declared import registry

    @ratelimit(name="login", rate="5/m", algorithm="sliding_log", methods="POST")
    def login(request):
        return HttpResponse("in")

    def page(request):
        return HttpResponse("ok")

    urls = types.ModuleType("busy_site_urls")
    urls.urlpatterns = [path("accounts/login/", login), path("search/", page),
                        path("api/items/", page), path("admin/", admin.site.urls)]
    settings.ROOT_URLCONF = urls
    registry.forget_written()
    registry.write(force=True)

    api = make_policy(name="api-per-key", algorithm="token_bucket", limit=1000, period=600,
                      burst=200, key="header:X-Api-Key", path="/api/**", priority=10,
                      description="Each API key: 1,000 requests per 10 minutes.")
    search = make_policy(name="search-crawlers", mode="shadow", algorithm="sliding_window",
                         limit=60, period=60, key="user_or_ip", path="/search/",
                         description="Watching before enforcing: would it stop the crawler?")
    make_policy(name="backend", algorithm="adaptive", limit=64, floor=4, period=10,
                key="global", path="/api/**", mode="enforce")
    make_policy(name="uploads", algorithm="concurrency", limit=4, key="user",
                path="/api/uploads/", methods="POST", rollout=25)
    soon = timezone.now() + timedelta(days=14)
    for match, fields in (("header:partner-4711", {"limit": 5000, "burst": 500,
                                                  "note": "Partner gateway, ticket 4711"}),
                          ("header:monitoring", {"exempt": True, "note": "Our uptime checks"}),
                          ("header:trial-0042", {"limit": 100, "expires": soon,
                                                 "note": "Trial, until its contract"})):
        Override.objects.create(policy=api, match=match, **fields)

    day(lambda ago, rnd: {"a": round(rnd.uniform(8, 14) + 6 * wave(ago)),
                          "r": round(rnd.uniform(25, 45)) if 150 < ago < 190 else
                          (1 if rnd.random() < 0.05 else 0)}, "login")
    day(lambda ago, rnd: {"a": round(rnd.uniform(420, 520) + 250 * wave(ago)),
                          "r": round(rnd.uniform(10, 40)) if ago % 240 < 25 else 0},
        "api-per-key")
    day(lambda ago, rnd: {"a": round(rnd.uniform(35, 50) + 20 * wave(ago)),
                          "w": round(rnd.uniform(18, 30)) if 8 < ago < 42 or 600 < ago < 660
                          else (1 if rnd.random() < 0.1 else 0)}, "search-crawlers")
    day(lambda ago, rnd: {"a": round(rnd.uniform(300, 400) + 150 * wave(ago)),
                          "r": round(rnd.uniform(0, 12)) if 20 < ago < 30 else 0}, "backend")
    day(lambda ago, rnd: {"a": round(rnd.uniform(2, 6)),
                          "r": 1 if rnd.random() < 0.04 else 0}, "uploads")
    return {"api": api, "search": search}


def wave(ago: int) -> float:
    """A day's rhythm, 0 at night to 1 in the afternoon, `ago` minutes before now."""
    return (1 + math.sin(2 * math.pi * (ago - 360) / (24 * 60))) / 2


def day(per_minute, name: str) -> None:
    """Figures for each of the last 24 hours' minutes (the current one left to the
    requests), added to the counters as the engine adds its own."""
    from ratelimits.pipeline.engines import get_engine

    engine, rnd, now = get_engine(), random.Random(name), time.time()
    for ago in range(1, 24 * 60):
        fields = {k: n for k, n in per_minute(ago, rnd).items() if n}
        if fields:
            engine.count_fields(name, int((now - 60 * ago) * 1_000_000), fields)


def offend(client, path: str, clients: dict[str, int], method: str = "get") -> None:
    """`clients[ip]` requests from each address: the offenders table's rows."""
    for ip, n in clients.items():
        for _ in range(n):
            getattr(client, method)(path, REMOTE_ADDR=ip)


@pytest.mark.slow
def test_the_admin_pages_the_docs_show(
    live_server, browser_page, shots, django_user_model, busy_site, client
):
    """The policy list, a policy's charts, the overrides inline and a shadow policy's
    would-reject chart, at 1,400 px, with a day of figures: the pictures of docs/."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    offend(client, "/accounts/login/", {"203.0.113.77": 24, "198.51.100.23": 9,
                                        "192.0.2.5": 6}, method="post")
    page, base = browser_page, live_server.url
    log_in(page, base)

    page.goto(f"{base}/admin/ratelimits/policy/")
    cells = page.locator("#result_list td.field-last_hour")
    assert cells.count() == 5
    for i in range(5):
        assert lines_of(cells.nth(i)) <= 2, cells.nth(i).inner_text()
    login = page.locator("#result_list tbody tr", has_text="login")
    assert "(view login)" in login.locator("td.field-matches").inner_text()
    assert "/accounts/login/" in login.locator("td.field-matches").inner_text()
    page.locator("#content").screenshot(path=str(shots / "admin-policy-list.png"))

    login.locator("th a").click()
    assert int(page.locator("#rl-rejected").inner_text().replace(",", "")) > 0
    assert page.locator("svg.rl-chart").count() == 2
    assert page.locator("#rl-offenders").inner_text().count("ip:203.0.113.77") == 1
    page.locator("#observe").screenshot(path=str(shots / "admin-policy-charts.png"))

    page.goto(f"{base}/admin/ratelimits/policy/{busy_site['api'].pk}/change/")
    assert page.locator("#overrides-group tbody tr.has_original").count() == 3
    assert page.locator("#overrides-group th.column-burst").count() == 1  # a bucket's
    assert_inline_fits(page)
    page.locator("#overrides-group").screenshot(path=str(shots / "admin-overrides.png"))

    page.goto(f"{base}/admin/ratelimits/policy/{busy_site['search'].pk}/change/")
    assert int(page.locator("#rl-would-reject").inner_text().replace(",", "")) > 0
    assert page.locator("#rl-rejected").inner_text() == "0"
    chart = page.locator("svg.rl-chart").first
    assert chart.locator("polyline.rl-would_reject").count() >= 1
    top = page.locator("#observe").bounding_box()
    bottom = chart.bounding_box()
    assert top is not None and bottom is not None
    page.screenshot(path=str(shots / "admin-shadow.png"), full_page=True, clip={
        "x": top["x"], "y": top["y"], "width": top["width"],
        "height": bottom["y"] + bottom["height"] - top["y"] + 8,
    })


# -- measures -------------------------------------------------------------------------------


def lines_of(cell) -> int:
    """How many lines of text a table cell's content takes (whatever the row's height,
    which its other cells may set)."""
    return cell.evaluate("""td => {
        const style = getComputedStyle(td);
        const line = parseFloat(style.lineHeight) || 1.2 * parseFloat(style.fontSize);
        const range = document.createRange();
        range.selectNodeContents(td);
        // n lines of text span (n - 1) line heights and one line's glyphs
        return Math.round(range.getBoundingClientRect().height / line + 0.2);
    }""")


def assert_inline_fits(page) -> None:
    """The overrides inline at the window's width, navigation open: its table, up to the
    Delete? header, lies inside the inline's box, nothing scrolls sideways, and no
    header is clipped."""
    # the admin's script opens the sidebar once the page has loaded: wait for it (an
    # error if it never opens)
    page.locator("#nav-sidebar").wait_for(state="visible", timeout=5000)
    box = page.evaluate("""() => {
        const group = document.querySelector('#overrides-group');
        const table = group.querySelector('table');
        const heads = [...table.querySelectorAll('thead th')];
        const last = heads[heads.length - 1];
        return {
            group: group.getBoundingClientRect().right,
            table: table.getBoundingClientRect().right,
            last: last.getBoundingClientRect().right,
            lastText: last.innerText.trim(),
            clipped: heads.filter(th => th.scrollWidth > th.clientWidth + 1)
                          .map(th => th.innerText.trim()),
            scroll: [group, ...group.querySelectorAll('fieldset, div, table')]
                        .filter(el => el.scrollWidth > el.clientWidth + 1)
                        .map(el => el.tagName + '.' + el.className),
            page: document.documentElement.scrollWidth,
            window: window.innerWidth,
        };
    }""")
    assert box["lastText"].upper() == "DELETE?", box
    assert box["last"] <= box["group"] + 0.5 and box["table"] <= box["group"] + 0.5, box
    assert not box["clipped"] and not box["scroll"], box
    assert box["page"] <= box["window"], box
