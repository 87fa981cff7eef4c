"""Observe, then enforce, as an operator does it: a real Chromium drives the admin.

Debian's Chromium (`make test` installs it) is driven by Playwright for Python through
its executable path; Playwright's own browser download is never used. Screenshots go to
a temporary directory, or to `RATELIMITS_SCREENSHOTS` (`make screenshots` sets it to
docs/img, the pictures the README shows).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

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
        page = browser.new_page(viewport={"width": 1700, "height": 900})
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
    assert page.locator("#nav-sidebar").is_visible()
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
