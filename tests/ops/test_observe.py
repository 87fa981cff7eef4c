"""What the admin shows of each policy: last-hour columns, charts, offenders, reset, dashboard."""

from __future__ import annotations

import pytest

from ratelimits.ops import observe
from ratelimits.pipeline.engines import get_engine

URL = "/admin/ratelimits/policy/"


def hit(client, n: int, ip: str = "203.0.113.7", path: str = "/hello/") -> list[int]:
    return [client.get(path, REMOTE_ADDR=ip).status_code for _ in range(n)]


def test_counters_add_up_to_the_requests_sent(any_store, client, make_policy):
    make_policy(name="enforced", limit=2)
    make_policy(name="watch", limit=1, mode="shadow")
    statuses = hit(client, 5)
    assert statuses == [200, 200, 429, 429, 429]
    totals = observe.last_hour(["enforced", "watch"])
    assert totals["enforced"] == observe.PolicyCounts(admitted=2, rejected=3)
    # the shadow policy admitted the first, would have refused the next one, then the
    # enforced policy refused the rest: would-reject whatever the other policy did
    assert totals["watch"] == observe.PolicyCounts(admitted=1, would_reject=4)
    assert sum(c.total for c in totals.values()) == 2 * len(statuses)


def test_list_shows_each_policys_last_hour(admin_client, client, make_policy):
    make_policy(name="login", limit=2, path="/hello/")
    make_policy(name="quiet", path="/search/")
    hit(client, 5)
    response = admin_client.get(URL)
    rows = {p.name: p for p in response.context["cl"].result_list}
    assert rows["login"]._hour == observe.PolicyCounts(admitted=2, rejected=3)
    assert rows["quiet"]._hour == observe.PolicyCounts()
    page = response.content.decode()
    assert "last hour" in page.lower()
    assert '<span class="rl-rejected" title="3 rejected">3</span> rejected' in page
    assert '<span class="rl-share" title="60.0% of the requests' in page  # 3 of 5 refused
    assert "—" in page  # no traffic: no share


@pytest.mark.parametrize(
    ("mode", "counts", "lines"),
    [
        ("enforce", observe.PolicyCounts(admitted=1_234_567, rejected=89_012),
         ["1.2M admitted", "89k rejected · 6.7%"]),
        ("shadow", observe.PolicyCounts(admitted=3, would_reject=4),
         ["3 admitted", "4 would reject · 57.1%"]),
        # switched to shadow within the hour: both kinds of refusal
        ("shadow", observe.PolicyCounts(admitted=9_500, rejected=12, would_reject=1_050),
         ["9.5k admitted", "12 rejected · 1.1k would reject · 10.1%"]),
        ("off", observe.PolicyCounts(), ["0 admitted", "0 refused · —"]),
    ],
)
def test_the_lists_last_hour_is_two_short_lines_with_the_full_figures_as_titles(
    mode, counts, lines
):
    """Compact enough not to wrap: two lines of short figures, never wrapped, each
    figure's full form in its title."""
    import re

    from ratelimits.models import Policy
    from ratelimits.ops import dashboard

    cell = str(dashboard.hour_cell(Policy(name="p", mode=mode), counts))
    assert cell.startswith('<span class="rl-hour">') and cell.count("<br>") == 1
    assert [re.sub(r"<[^>]+>", "", line) for line in cell.split("<br>")] == lines
    titles = re.findall(r'title="([^"]+)"', cell)
    assert f"{counts.admitted:,} admitted" in titles
    assert all(len(short) <= 5 for short in re.findall(r'title="[^"]+">([^<]+)<', cell))


def test_policy_page_charts_offenders_and_shadow_advice(admin_client, client, make_policy):
    policy = make_policy(name="search-watch", limit=1, mode="shadow", path="/hello/")
    hit(client, 4, ip="198.51.100.1")
    hit(client, 2, ip="198.51.100.2")
    response = admin_client.get(f"{URL}{policy.pk}/change/")
    ctx = response.context
    assert ctx["hour_counts"] == observe.PolicyCounts(admitted=2, would_reject=4)
    assert ctx["offenders"] == [("ip:198.51.100.1", 3), ("ip:198.51.100.2", 1)]
    page = response.content.decode()
    assert page.count('class="rl-chart"') == 2  # last hour and last 24 hours
    assert "would reject (shadow) (4)" in page  # legend names the series with its total
    assert 'stroke-dasharray="2 3"' in page  # told apart by pattern, not colour alone
    assert "Switch to enforce" in page
    assert "<code>ip:198.51.100.1</code>" in page


def test_reset_this_client_lets_it_through_again(admin_client, client, make_policy):
    policy = make_policy(name="login", limit=1, path="/hello/")
    assert hit(client, 2, ip="192.0.2.9") == [200, 429]
    assert hit(client, 1, ip="192.0.2.10") == [200]
    response = admin_client.post(
        f"{URL}{policy.pk}/reset-client/", {"identity": "192.0.2.9"}, follow=True
    )
    assert "Reset &#x27;ip:192.0.2.9&#x27; under login" in response.content.decode()
    assert hit(client, 1, ip="192.0.2.9") == [200]
    assert hit(client, 1, ip="192.0.2.10") == [429]  # only that client was reset


def test_reset_needs_a_post_and_the_change_permission(client, staff, make_policy):
    from django.contrib.auth.models import Permission

    policy = make_policy(name="login", limit=1, path="/hello/")
    staff.user_permissions.add(Permission.objects.get(codename="view_policy"))
    assert client.get(f"{URL}{policy.pk}/reset-client/").status_code == 403
    assert client.post(f"{URL}{policy.pk}/reset-client/", {"identity": "x"}).status_code == 403


def test_dashboard_is_linked_from_the_index_and_shows_every_policy(admin_client, client,
                                                                  make_policy):
    make_policy(name="a-policy", limit=1, path="/hello/")
    make_policy(name="b-policy", path="/search/", mode="shadow")
    hit(client, 3)
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/ratelimits/policydashboard/" in index
    assert admin_client.get("/admin/ratelimits/policydashboard/").url == f"{URL}dashboard/"
    page = admin_client.get(f"{URL}dashboard/").content.decode()
    assert page.count('class="rl-spark"') == 2
    assert "a-policy" in page and "b-policy" in page
    assert "66.7%" in page  # a-policy: 2 of 3 refused


class ServerLog:
    """Every command clients send to the test's Redis, as the server itself sees it
    (MONITOR, which also shows commands run inside scripts: those are left out)."""

    def __init__(self, url: str) -> None:
        import redis

        self.marker = redis.Redis.from_url(url)
        self._monitor = redis.Redis.from_url(url).monitor()
        self._monitor.__enter__()
        self._mark("ready")
        self._until("ready")

    def _mark(self, text: str) -> None:
        self.marker.echo(f"test-marker:{text}")

    def _until(self, text: str) -> list[str]:
        seen = []
        while True:
            entry = self._monitor.next_command()
            command = entry["command"]
            if command == f"ECHO test-marker:{text}":
                return seen
            if entry.get("client_type") != "lua":
                seen.append(command.split(" ", 1)[0].upper())

    def during(self, action) -> list[str]:
        """The commands sent while `action()` ran (any client but the monitor's)."""
        self._mark("start")
        self._until("start")
        action()
        self._mark("end")
        return self._until("end")

    def close(self) -> None:
        self._monitor.__exit__()
        self.marker.close()


def test_pages_cost_a_bounded_number_of_round_trips_and_never_scan(
    admin_client, client, make_policy, redis_url
):
    from collections import Counter

    for i in range(12):
        make_policy(name=f"p{i}", path=f"/p{i}/")
    policy = make_policy(name="login", limit=1, path="/hello/")
    hit(client, 3)
    pages = {
        URL: Counter(HGETALL=13 * 60),  # one hour of minutes per policy
        # offenders: each of two hours' list and the errors beside it (guaranteed counts)
        f"{URL}{policy.pk}/change/": Counter(HGETALL=60 + 24 * 60 + 2, ZRANGE=2),
        f"{URL}dashboard/": Counter(HGETALL=13 * 60),
    }
    for page in pages:  # connections opened, scripts loaded: only steady state is counted
        assert admin_client.get(page).status_code == 200

    engine = get_engine()
    pipelined: list[int] = []  # commands each pipeline sent, in one round trip
    original = engine.client.pipeline

    def counting(*args, **kwargs):  # a spy: the real pipeline still runs
        pipe = original(*args, **kwargs)
        execute = pipe.execute

        def counted_execute(*a, **k):
            pipelined.append(len(pipe.command_stack))
            return execute(*a, **k)

        pipe.execute = counted_execute
        return pipe

    log = ServerLog(redis_url)
    engine.client.pipeline = counting
    engine.heartbeat = None  # its beat may ride on the request's call: measured elsewhere
    try:
        for page, reads in pages.items():
            before = len(pipelined)
            response = None

            def load(page=page):
                nonlocal response
                response = admin_client.get(page)

            sent = Counter(log.during(load))
            assert response.status_code == 200
            # Exactly the page's reads and at most a version read for the request itself
            # (once a second per process): a stray command of any kind fails here.
            assert sent["GET"] <= 1, page
            assert sent - Counter(GET=sent["GET"]) == reads, page
            # The reads went in at most three pipelines (round trips): the list and the
            # dashboard one for all 13 policies; a policy's page its hour, day, offenders.
            rounds = pipelined[before:]
            assert len(rounds) <= 3 and sum(rounds) == sum(reads.values()), page
    finally:
        engine.client.pipeline = original
        log.close()


def test_pages_open_with_unknown_figures_when_the_store_is_down(admin_client, make_policy,
                                                                settings):
    from tests.redis_server import free_port

    policy = make_policy(name="login", limit=1)
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    listing = admin_client.get(URL)
    assert listing.status_code == 200
    assert listing.context["cl"].result_list[0]._hour is None
    page = admin_client.get(f"{URL}{policy.pk}/change/")
    assert page.status_code == 200
    assert "The store did not answer" in page.content.decode()
    assert admin_client.get(f"{URL}dashboard/").status_code == 200


@pytest.mark.parametrize("minutes", [60, 1440])
def test_series_is_oldest_first_with_the_current_minute_last(memory_store, minutes):
    from ratelimits.engine import Limit

    engine = get_engine()
    now = 1_800_000_000.0
    limit = Limit("c", "fixed_window", 1, 60, name="s")
    engine.evaluate([limit], now=now - 120)  # two minutes ago: admitted
    engine.evaluate([limit], now=now)  # this minute: admitted (new window)
    engine.evaluate([limit], now=now)  # refused
    counts = observe.series(["s"], minutes, now=now)["s"]
    assert len(counts) == minutes
    assert counts[-1] == observe.PolicyCounts(admitted=1, rejected=1)
    assert counts[-3] == observe.PolicyCounts(admitted=1)
    assert sum(counts, observe.PolicyCounts()).total == 3


def test_reset_a_bare_ipv6_address_resets_its_64(admin_client, client, make_policy):
    policy = make_policy(name="v6", limit=1, path="/hello/")
    assert hit(client, 2, ip="2001:db8:1:2::7") == [200, 429]
    admin_client.post(f"{URL}{policy.pk}/reset-client/", {"identity": "2001:db8:1:2::1"})
    assert hit(client, 1, ip="2001:db8:1:2::99") == [200]  # same /64: reset


def test_reset_refuses_what_cannot_be_a_client(admin_client, make_policy):
    policy = make_policy(name="login", limit=1, path="/hello/")
    response = admin_client.post(
        f"{URL}{policy.pk}/reset-client/", {"identity": "not-an-ip"}, follow=True
    )
    assert "is not an IP address" in response.content.decode()
