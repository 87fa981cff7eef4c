"""A site whose limits live in PostgreSQL (`RATELIMITS["DATABASE"]`), through the
middleware: enforced there, and each policy's `on_error` while the server is out of
reach, never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter

import pytest

from ratelimits.engine import Limit
from ratelimits.engine.postgres import PostgresEngine
from ratelimits.pipeline.engines import get_engine
from tests.engine.conftest import T0


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def test_requests_are_limited_in_postgresql(client, make_policy, settings, postgres_url):
    settings.RATELIMITS = {**settings.RATELIMITS, "DATABASE": postgres_url}
    make_policy(name="pg", limit=3, path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(5)] == [200, 200, 200, 429, 429]
    get_engine().flush()  # the tally, sent now rather than within a second
    counted: Counter[str] = Counter()
    for counts in PostgresEngine(postgres_url).counters_many(
            [("pg", minute) for minute in _minutes_of(postgres_url, "pg")]):
        counted.update(counts)  # a minute may have turned meanwhile
    assert counted == {"a": 3, "r": 2}


EXPECTED = {"allow": [200] * 6, "deny": [503] * 6, "local": [200, 200, 200, 429, 429, 429]}


@pytest.mark.parametrize("on_error", list(EXPECTED))
def test_a_server_out_of_reach_follows_on_error(client, make_policy, settings, on_error,
                                                caplog):
    settings.RATELIMITS = {**settings.RATELIMITS, "DATABASE": _dead_url()}
    make_policy(name=f"pg-{on_error}", limit=3, path="/hello/", on_error=on_error)
    with caplog.at_level(logging.ERROR, "ratelimits"):
        statuses = [client.get("/hello/").status_code for _ in range(6)]
    assert statuses == EXPECTED[on_error]
    assert caplog.text.count("store is unavailable") == 1  # once for the outage
    assert "Traceback" not in caplog.text


def test_async_code_awaits_a_decision_in_a_worker_thread(postgres_url):
    engine = PostgresEngine(postgres_url)
    limit = Limit("c", "fixed_window", 1, 60)
    try:
        first = asyncio.run(engine.aevaluate([limit], now=T0))
        second = asyncio.run(engine.aevaluate([limit], now=T0))
    finally:
        engine.close()
    assert (first.allowed, second.allowed) == (True, False)


def test_the_admin_shows_each_policys_last_hour_from_postgresql(
        admin_client, client, make_policy, settings, postgres_url):
    """The admin's list reads the counters from PostgreSQL, where every process sends
    them: an engine of another process (a new one here) sees what this one counted."""
    from ratelimits.ops import observe

    settings.RATELIMITS = {**settings.RATELIMITS, "DATABASE": postgres_url}
    make_policy(name="pg-login", limit=2, path="/hello/")
    make_policy(name="pg-watch", limit=1, mode="shadow", path="/hello/")
    assert [client.get("/hello/").status_code for _ in range(5)] == [200, 200, 429, 429, 429]
    response = admin_client.get("/admin/ratelimits/policy/")
    rows = {p.name: p for p in response.context["cl"].result_list}
    assert rows["pg-login"]._hour == observe.PolicyCounts(admitted=2, rejected=3)
    assert rows["pg-watch"]._hour == observe.PolicyCounts(admitted=1, would_reject=4)
    assert '<span class="rl-share" title="60.0% of the requests' in response.content.decode()
    elsewhere = PostgresEngine(postgres_url)
    try:
        counted: Counter[str] = Counter()
        for counts in elsewhere.counters_many([("pg-login", m) for m in _minutes_of(
                postgres_url, "pg-login")]):  # a minute may have turned meanwhile
            counted.update(counts)
    finally:
        elsewhere.close()
    assert counted == {"a": 2, "r": 3}


def _minutes_of(url: str, name: str) -> list[int]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT DISTINCT minute FROM ratelimits_counts_v1 WHERE name = %s", (name,))]
