"""What operators use, on a real Redis Cluster: the admin's list, a policy's page and the
dashboard, `manage.py ratelimits status` / `reset`, the Prometheus metrics and the
live-edit version, with `RATELIMITS["REDIS_URL"]` pointing at the cluster.

Traffic goes through the middleware first; the counters it tallies in process reach the
cluster when a page reads them (`counters()` flushes this process's tally first), so no
test waits for a flush. Each page's commands are counted on every node as the node sees
them (MONITOR): exactly the reads the page needs, never KEYS or SCAN.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.cluster_counts import cluster_offenders_key
from ratelimits.engine.keynames import stats_key
from ratelimits.ops import observe
from ratelimits.pipeline.changes import listener
from ratelimits.pipeline.engines import get_engine
from tests.pipeline.test_metrics import (
    counts,
    enable,
    engine_calls,
    outcomes,
    scrape,
    unique,
)
from tests.pipeline.test_promises_store import PREFIX
from tests.pipeline.test_redis_url import use_url

URL = "/admin/ratelimits/policy/"


@pytest.fixture
def on_cluster(cluster, settings):
    """REDIS_URL on the (emptied) cluster."""
    use_url(settings, cluster.url)
    yield cluster
    engine = get_engine()
    if isinstance(engine, ClusterEngine):
        engine.close()  # its client and flush thread go with the test
        engine.client.close()


def hit(client, n: int, ip: str = "203.0.113.7", path: str = "/hello/") -> list[int]:
    return [client.get(path, REMOTE_ADDR=ip).status_code for _ in range(n)]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimits", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# -- counting what every node is sent --------------------------------------------------------


class NodeLog:
    """Every command the clients send to one node, as the node sees it (MONITOR); the
    commands scripts run inside the node are left out."""

    def __init__(self, port: int) -> None:
        self.marker = redis.Redis(port=port)
        self._monitor = redis.Redis(port=port).monitor()
        self._monitor.__enter__()
        self.mark("ready")
        self.until("ready")

    def mark(self, text: str) -> None:
        self.marker.echo(f"test-marker:{text}")

    def until(self, text: str) -> list[str]:
        seen = []
        while True:
            entry = self._monitor.next_command()
            command = entry["command"]
            if command == f"ECHO test-marker:{text}":
                return seen
            if entry.get("client_type") != "lua":
                seen.append(command)

    def close(self) -> None:
        self._monitor.__exit__()
        self.marker.close()


class ClusterLog:
    """What each primary was sent while an action ran: {port: [command line, ...]}."""

    def __init__(self, ports: list[int]) -> None:
        self.nodes = {port: NodeLog(port) for port in ports}

    def during(self, action: Callable[[], Any]) -> dict[int, list[str]]:
        for node in self.nodes.values():
            node.mark("start")
            node.until("start")
        action()
        for node in self.nodes.values():
            node.mark("end")
        return {port: node.until("end") for port, node in self.nodes.items()}

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


def verbs(lines: list[str]) -> Counter[str]:
    return Counter(line.split(" ", 1)[0].upper() for line in lines)


# -- the admin ---------------------------------------------------------------------------------


def test_list_shows_each_policys_last_hour_from_the_cluster(
    admin_client, client, make_policy, on_cluster
):
    make_policy(name="login", limit=2, path="/hello/")
    make_policy(name="watch", limit=1, mode="shadow", path="/hello/")
    make_policy(name="quiet", path="/search/")
    first_minute = observe.current_minute()
    assert hit(client, 5) == [200, 200, 429, 429, 429]
    assert isinstance(get_engine().store, ClusterEngine)

    response = admin_client.get(URL)

    rows = {p.name: p for p in response.context["cl"].result_list}
    assert rows["login"]._hour == observe.PolicyCounts(admitted=2, rejected=3)
    assert rows["watch"]._hour == observe.PolicyCounts(admitted=1, would_reject=4)
    assert rows["quiet"]._hour == observe.PolicyCounts()
    assert "60.0%" in response.content.decode()  # login: 3 of 5 refused
    # the figures were read back from the cluster's nodes, not from this process's tally
    # (in the minute's key, on the node that owns it; the minute may have turned meanwhile)
    counted: dict[bytes, int] = {}
    for minute in range(first_minute, observe.current_minute() + 1):
        key = stats_key(PREFIX, "login", minute)
        owner = on_cluster.client(get_engine().client.get_node_from_key(key).port)
        for field, n in owner.hgetall(key).items():
            counted[field] = counted.get(field, 0) + int(n)
    assert counted == {b"a": 2, b"r": 3}


def test_policy_page_charts_offenders_and_resets_one_client_on_the_cluster(
    admin_client, client, make_policy, on_cluster
):
    policy = make_policy(name="login", limit=1, path="/hello/")
    assert hit(client, 4, ip="198.51.100.1") == [200, 429, 429, 429]
    assert hit(client, 2, ip="198.51.100.2") == [200, 429]

    response = admin_client.get(f"{URL}{policy.pk}/change/")

    ctx = response.context
    assert not ctx["store_unreadable"]
    assert ctx["hour_counts"] == observe.PolicyCounts(admitted=2, rejected=4)
    assert ctx["offenders"] == [("ip:198.51.100.1", 3), ("ip:198.51.100.2", 1)]
    page = response.content.decode()
    assert page.count('class="rl-chart"') == 2
    assert "<code>ip:198.51.100.1</code>" in page
    # the offenders list lives on the cluster, on the node of the policy's hash tag
    hour = int(time.time() // 3600)
    key = cluster_offenders_key(PREFIX, "login", hour)
    owner = on_cluster.client(get_engine().client.get_node_from_key(key).port)
    assert owner.zscore(key, "ip:198.51.100.1") == 3

    reset = admin_client.post(
        f"{URL}{policy.pk}/reset-client/", {"identity": "198.51.100.1"}, follow=True
    )
    assert "Reset &#x27;ip:198.51.100.1&#x27; under login" in reset.content.decode()
    assert hit(client, 2, ip="198.51.100.1") == [200, 429]  # a full allowance again
    assert hit(client, 1, ip="198.51.100.2") == [429]  # only that client was reset


def test_dashboard_shows_every_policy_from_the_cluster(
    admin_client, client, make_policy, on_cluster
):
    make_policy(name="a-policy", limit=1, path="/hello/")
    make_policy(name="b-policy", path="/search/", mode="shadow")
    assert hit(client, 3) == [200, 429, 429]
    response = admin_client.get(f"{URL}dashboard/")
    rows = {row["policy"].name: row for row in response.context["rows"]}
    assert rows["a-policy"]["counts"] == observe.PolicyCounts(admitted=1, rejected=2)
    assert rows["b-policy"]["counts"] == observe.PolicyCounts()
    page = response.content.decode()
    assert page.count('class="rl-spark"') == 2
    assert "66.7%" in page


def listening() -> None:
    """Return once this process's listener has connected (once, in the background, soon
    after the store first answers): a page's round trips are counted without its own."""
    deadline = time.monotonic() + 10
    while listener.watch is None:
        assert time.monotonic() < deadline, "the listener did not connect"
        time.sleep(0.005)


#: What a connection sends while it connects: its cost, paid once, not a page's.
HANDSHAKE = (b"SETINFO", b"HELLO", b"AUTH", b"READONLY", b"SELECT")


class Writes:
    """How many times the process wrote a batch of commands to each port (one write, then
    its replies read: one round trip), a new connection's handshake aside (`seen`: the
    start of each write counted, for the message of an assertion). Counts around the
    real client's own method."""

    def __init__(self, monkeypatch) -> None:
        from redis.connection import AbstractConnection

        self.by_port: Counter[int] = Counter()
        self.seen: list[tuple[int, bytes]] = []
        original = AbstractConnection.send_packed_command

        def counted(conn, command, check_health=True):
            head = bytes(command if isinstance(command, (bytes, bytearray)) else command[0])
            if not any(word in head[:48] for word in HANDSHAKE):
                self.by_port[conn.port] += 1
                self.seen.append((conn.port, head[:48]))
            return original(conn, command, check_health)

        monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)


def test_pages_cost_a_bounded_number_of_round_trips_per_node_and_never_scan(
    admin_client, client, make_policy, on_cluster, monkeypatch
):
    for i in range(12):
        make_policy(name=f"p{i}", path=f"/p{i}/")
    policy = make_policy(name="login", limit=1, path="/hello/")
    assert hit(client, 3) == [200, 429, 429]
    listening()
    pages = {
        # (reads, round trips at most per node: pipelines of the page + the request's own)
        URL: (Counter(HGETALL=13 * 60), 1 + 1),
        f"{URL}{policy.pk}/change/": (Counter(HGETALL=60 + 24 * 60 + 2, ZRANGE=2), 3 + 1),
        f"{URL}dashboard/": (Counter(HGETALL=13 * 60), 1 + 1),
    }
    for page in pages:  # connections opened, the tally flushed: only steady state counted
        assert admin_client.get(page).status_code == 200
    engine = get_engine()
    primaries = on_cluster.primary_ports()
    log = ClusterLog(primaries)
    try:
        for page, (reads, rounds) in pages.items():
            response = None
            writes = Counter()

            def load(page=page):
                nonlocal response, writes
                with monkeypatch.context() as patch:
                    counter = Writes(patch)
                    response = admin_client.get(page)
                writes = counter.by_port

            sent = log.during(load)
            assert response.status_code == 200
            # the heartbeat that may ride on the request's call (engine.heartbeat) is not the page's
            sent = {port: [line for line in lines if f"{PREFIX}live" not in line]
                    for port, lines in sent.items()}
            # the middleware's call for the page's own request: at most a version read (a
            # request no policy matches reads it at most once a second)
            version_node = engine.client.get_node_from_key(f"{PREFIX}version").port
            total = sum((verbs(lines) for lines in sent.values()), Counter())
            # exactly the page's reads and the version: a stray command of any kind
            # (KEYS, SCAN, a MOVED retry, a flush) fails here
            assert total["GET"] <= 1, page
            assert total - Counter(GET=total["GET"]) == reads, page
            assert verbs(sent[version_node])["GET"] == total["GET"]
            for port, lines in sent.items():
                for line in lines:  # each read went straight to the node owning its key
                    key = line.split(" ")[1]  # every read names one key, first
                    assert engine.client.get_node_from_key(key).port == port, (page, line)
            # the reads were spread over the primaries, and each node was asked in a
            # bounded number of round trips whatever the number of policies
            assert set(writes) <= set(primaries)
            assert all(n <= rounds for n in writes.values()), (page, writes)
    finally:
        log.close()


def test_a_page_that_flushes_many_policies_offenders_still_costs_bounded_round_trips(
    admin_client, client, make_policy, on_cluster, monkeypatch
):
    """The first page after traffic sends this process's tally first: every policy's
    offenders, which must go out together, not one round trip per policy."""
    names = [f"watch{i}" for i in range(12)]
    for name in names:
        make_policy(name=name, mode="shadow", limit=1, path="/hello/")
    assert hit(client, 2) == [200, 200]  # each policy would have refused the second
    listening()
    with monkeypatch.context() as patch:
        writes = Writes(patch)
        response = admin_client.get(URL)
    assert response.status_code == 200
    assert {p.name: p._hour for p in response.context["cl"].result_list} == {
        name: observe.PolicyCounts(admitted=1, would_reject=1) for name in names
    }
    # per node: the counters' flush, the offenders' flush, the page's read, the version
    assert max(writes.by_port.values()) <= 4, writes.seen
    assert observe.offenders(names[0]) == [("ip:203.0.113.7", 1)]


# -- the live-edit version -----------------------------------------------------------------


def test_a_policy_saved_in_the_admin_is_seen_by_the_next_request(
    admin_client, client, make_policy, on_cluster, django_capture_on_commit_callbacks
):
    policy = make_policy(name="login", limit=5, path="/hello/")
    assert hit(client, 2) == [200, 200]
    form = {
        "name": "login",
        "description": "",
        "mode": "enforce",
        "priority": 0,
        "algorithm": "fixed_window",
        "limit": 2,
        "period": 3600,
        "burst": "",
        "cost": 1,
        "key": "ip",
        "path": "/hello/",
        "methods": "",
        "scope": "",
        "on_error": "allow", "counting": "shared", "rollout": 100, "max_wait": 0, "warmup": 0,
        "lockout": 0,
        "overrides-TOTAL_FORMS": 0, "overrides-INITIAL_FORMS": 0,
    }
    engine = get_engine()
    before = engine.client.get(f"{PREFIX}version")
    with django_capture_on_commit_callbacks(execute=True):
        saved = admin_client.post(f"{URL}{policy.pk}/change/", form)
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    # the version on the cluster moved, so every process reloads at its next request
    assert int(engine.client.get(f"{PREFIX}version")) == int(before) + 1
    assert hit(client, 1) == [429]  # the new limit of 2 already applies


def _address_away_from_version(policy: str = "login") -> str:
    """An address whose key under `policy` (fixed_window, key ip) lives on another node
    than the version key."""
    from ratelimits.engine import Limit
    from tests.engine.test_cluster_engine import beside_version

    limits = (Limit(f"ip:198.51.100.{i}", "fixed_window", 1, 3600, name=policy)
              for i in range(1, 255))
    away = beside_version(get_engine().client, False, limits, prefix=PREFIX)
    return away.key.removeprefix("ip:")


def test_an_edit_reaches_requests_decided_away_from_the_versions_node_within_a_second(
    client, make_policy, on_cluster, clock, monkeypatch
):
    """A request whose keys live on other nodes than the version key's carries no version
    (no node more is sent a call for it): the process reads it at most once a second, so
    an edit that nothing pushes still applies within that second."""
    monkeypatch.setattr(listener, "ensure", lambda: None)  # nothing heard: the version tells
    make_policy(name="login", limit=100, path="/hello/")
    away = _address_away_from_version()
    assert hit(client, 1, ip=away) == [200]
    engine = get_engine()
    # saved by another process: in the database, the version moved, this process not told
    from ratelimits.models import Policy

    Policy.objects.filter(name="login").update(limit=1)
    engine.client.incr(f"{PREFIX}version")
    clock.advance(0.5)
    # the version was read less than a second ago: the old limit still applies
    assert hit(client, 2, ip=away) == [200, 200]
    clock.advance(0.5)
    # the first reads it and reloads (its policy was met under the old snapshot); the
    # next is refused under the new limit
    assert hit(client, 2, ip=away) == [200, 429]


# -- manage.py ratelimits status / reset -----------------------------------------------------


def test_status_reads_the_last_hour_from_the_cluster(client, make_policy, on_cluster):
    make_policy(name="hello-ip", limit=2, period=600, path="/hello/")
    make_policy(name="watch", mode="shadow", limit=1, period=60, path="/hello/")
    make_policy(name="idle", mode="off", limit=100, period=60)
    assert hit(client, 3) == [200, 200, 429]

    text = run("status")

    rows = {row.split()[0]: row for row in text.splitlines()[1:]}
    assert rows["hello-ip"].split()[-4:] == ["2", "1", "0", "33.3%"]
    assert rows["watch"].split()[-4:] == ["1", "0", "2", "66.7%"]
    assert rows["idle"].split()[-4:] == ["0", "0", "0", "—"]
    assert "all processes (the store's counters)" in text
    data = json.loads(run("status", "--json"))
    assert data["error"] is None
    hour = {p["name"]: p["last_hour"] for p in data["policies"]}
    assert (hour["hello-ip"]["admitted"], hour["hello-ip"]["rejected"]) == (2, 1)
    assert hour["watch"]["would_reject"] == 2


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "gcra"])
def test_reset_command_lets_a_refused_client_through_again(
    client, make_policy, on_cluster, algorithm
):
    make_policy(name="hello-ip", algorithm=algorithm, limit=1, period=3600, path="/hello/")
    make_policy(name="other", limit=1, period=3600, path="/login/")
    assert hit(client, 2) == [200, 429]
    assert hit(client, 2, path="/login/") == [200, 429]

    out = run("reset", "hello-ip", "--key", "203.0.113.7")

    assert "Reset ip:203.0.113.7 under policy hello-ip" in out
    assert hit(client, 2) == [200, 429]  # a full allowance, then the limit again
    assert hit(client, 1, path="/login/") == [429]  # other policies keep their state


def test_reset_command_without_a_key_names_the_clusters_recent_offenders(
    client, make_policy, on_cluster
):
    make_policy(name="hello-ip", limit=1, period=3600, path="/hello/")
    assert hit(client, 3) == [200, 429, 429]
    with pytest.raises(CommandError, match=r"--key .*ip:203\.0\.113\.7 \(2\)"):
        run("reset", "hello-ip")


# -- Prometheus ------------------------------------------------------------------------------


def test_metrics_count_each_outcome_on_the_cluster_as_on_one_server(
    client, make_policy, settings, on_cluster
):
    enable(settings)
    tight, wide, shadow = unique("tight"), unique("wide"), unique("shadow")
    make_policy(name=tight, limit=1, path="/hello/")
    make_policy(name=wide, limit=10, path="/hello/")
    make_policy(name=shadow, mode="shadow", limit=1, path="/hello/")
    before = scrape(client)

    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 429, 429]

    after = scrape(client)
    assert isinstance(get_engine().store, ClusterEngine)
    assert outcomes(after, tight) == counts(admitted=1, rejected=2)
    assert outcomes(after, wide) == counts(admitted=1, spared=2)
    assert outcomes(after, shadow) == counts(admitted=1, would_reject=2)
    # the engine calls are timed as Redis calls (the scrapes themselves are exempt)
    assert engine_calls(after, "redis") - engine_calls(before, "redis") == 3
    assert engine_calls(after, "memory") == engine_calls(before, "memory")


def test_async_requests_are_decided_on_the_event_loop_on_the_cluster(
    on_cluster, async_client, make_policy, monkeypatch
):
    """Under ASGI on a cluster URL the app awaits the cluster's asyncio twin: the same
    answers as the blocking path, decided on the loop's own thread."""
    import threading

    from asgiref.sync import async_to_sync

    from ratelimits.engine.aio import AsyncClusterEngine

    make_policy(name="edge", limit=2, path="/async/")
    decided_on = []
    evaluate = AsyncClusterEngine.evaluate

    async def watched(self, limits, now=None):
        decided_on.append(threading.get_ident())
        return await evaluate(self, limits, now)

    monkeypatch.setattr(AsyncClusterEngine, "evaluate", watched)

    async def three():
        loop_thread = threading.get_ident()
        statuses = [(await async_client.get("/async/")).status_code for _ in range(3)]
        return loop_thread, statuses

    loop_thread, statuses = async_to_sync(three)()
    assert statuses == [200, 200, 429]
    assert isinstance(get_engine().aio, AsyncClusterEngine)
    assert decided_on and set(decided_on) == {loop_thread}
    assert observe.last_hour(["edge"])["edge"] == observe.PolicyCounts(admitted=2, rejected=1)


def test_a_deleted_policys_figures_go_with_it_on_the_cluster(
    admin_client, client, make_policy, on_cluster, django_capture_on_commit_callbacks
):
    """Its counters (a key per minute, each in its own slot) and offenders (hash-tagged by
    the policy) are deleted where they live: a policy created again under its name starts
    from zero."""
    policy = make_policy(name="login", limit=1, path="/hello/")
    assert hit(client, 3) == [200, 429, 429]
    earlier = int(time.time() * 1_000_000) - 5 * 3600 * 1_000_000
    get_engine().count_fields("login", earlier, {"a": 7})
    assert observe.last_hour(["login"])["login"] == observe.PolicyCounts(admitted=1, rejected=2)
    minute, hour = int(time.time() // 60), int(time.time() // 3600)
    keys = [stats_key(PREFIX, "login", minute), stats_key(PREFIX, "login", earlier // 60_000_000),
            cluster_offenders_key(PREFIX, "login", hour)]
    assert all(stored(key) for key in keys)

    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.post(f"{URL}{policy.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not any(stored(key) for key in keys)
    again = make_policy(name="login", limit=1, path="/hello/")
    page = admin_client.get(f"{URL}{again.pk}/change/").context
    assert page["hour_counts"] == observe.PolicyCounts() and page["offenders"] == []
    assert sum(observe.series(["login"], 24 * 60)["login"], observe.PolicyCounts()).total == 0


def stored(key: str) -> bool:
    return bool(get_engine().client.exists(key))
