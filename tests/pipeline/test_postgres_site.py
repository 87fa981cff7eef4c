"""A site whose limits live in PostgreSQL (`RATELIMITS["DATABASE"]`), through the
middleware: enforced there, and each policy's `on_error` while the server is out of
reach, never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import logging
import socket

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
    (counts,) = PostgresEngine(postgres_url).counters_many(
        [("pg", minute) for minute in _minutes(postgres_url)])
    assert counts == {"a": 3, "r": 2}


def _minutes(url: str) -> list[int]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT DISTINCT minute FROM ratelimits_counts_v1 WHERE name = 'pg'")]


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
