"""ClusterEngine on a real Redis Cluster (3 primaries, 3 replicas): all-or-nothing charging
across primaries with compensating refunds, the same decisions as the in-process engine,
an 8-process race, and counters and offenders tallied and flushed. (The conformance
tables run on it with every other engine: tests/engine/test_conformance.py.)"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import random
import time

import pytest
import redis
import redis.cluster

from ratelimits.engine import ALGORITHMS, EngineUnavailable, Limit, MemoryEngine
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.contract import FIELDS, decode_slot, encode
from ratelimits.engine.flows import run_flow
from ratelimits.engine.keynames import base_key, cell, period_us, stats_key, to_us
from ratelimits.engine.types import Outcome
from tests.engine.conftest import T0
from tests.redis_cluster import RedisCluster
from tests.redis_server import wait_replicated

pytestmark = pytest.mark.slow


def _client(cluster: RedisCluster) -> redis.cluster.RedisCluster:
    return redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


@pytest.fixture
def client(cluster):
    c = _client(cluster)
    yield c
    c.close()


@pytest.fixture
def engine(client):
    e = ClusterEngine(client, version_key="rl:version")
    yield e
    e.close()


def _node(client, limit: Limit) -> str:
    return client.get_node_from_key(base_key("rl:", limit)).name


def three_on_three(client, algorithms=("fixed_window", "sliding_log", "gcra"),
                   limits=(5, 3, 10), period: float = 60.0) -> list[Limit]:
    """An ip, a user and a global limit whose keys sit on three different primaries."""
    for i in range(10_000):
        trio = [
            Limit(f"ip:203.0.113.{i}", algorithms[0], limits[0], period, name="per-ip"),
            Limit(f"user:{i}", algorithms[1], limits[1], period, name="per-user"),
            Limit("global", algorithms[2], limits[2], period, name=f"global-{i}"),
        ]
        if len({_node(client, limit) for limit in trio}) == 3:
            return trio
    raise AssertionError("no three keys on three primaries")


def _state(client, limit: Limit, now: float) -> object:
    """What the cluster holds for one limit, read raw (windows at `now`)."""
    key, field = cell("rl:", limit)
    if limit.spec.windowed:
        win = math.floor(to_us(now) / period_us(limit))
        return (client.hget(f"{key}:{win}", field), client.hget(f"{key}:{win - 1}", field))
    kind = client.type(key)
    if kind == b"zset":
        return client.zrange(key, 0, -1, withscores=True)
    if kind == b"hash":
        return client.hgetall(key)
    return client.get(key)


# -- all or nothing across primaries ----------------------------------------------------


def test_a_refusal_on_one_primary_charges_none_of_the_others(client, engine):
    ip, user, glob = three_on_three(client)
    for i in range(3):
        assert engine.evaluate([ip, user, glob], now=T0 + i).allowed
    before = [_state(client, limit, T0 + 3) for limit in (ip, glob)]
    refused = engine.evaluate([ip, user, glob], now=T0 + 3)
    assert not refused.allowed
    assert [r.outcome for r in refused.results] == [Outcome.SPARED, Outcome.REJECTED,
                                                    Outcome.SPARED]
    # the spared limits report what they would have left had they been charged
    assert [r.remaining for r in refused.results] == [2, 0, 7]
    assert [_state(client, limit, T0 + 3) for limit in (ip, glob)] == before
    # and they decide on from there: ip has 2 left, global 7
    assert engine.evaluate([ip], now=T0 + 4).results[0].remaining == 1
    assert engine.evaluate([glob], now=T0 + 4).results[0].remaining == 6


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_refund_puts_back_exactly_what_the_charge_took(client, engine, algorithm):
    charged, _, refusing = three_on_three(client, (algorithm, "sliding_log", "fixed_window"),
                                          (4, 3, 1))
    charged = dataclasses.replace(charged, cost=2,
                                  burst=4 if charged.spec.has_burst else None)
    assert engine.evaluate([charged, refusing], now=T0).allowed  # refusing is now full
    before = _state(client, charged, T0 + 0.25)
    assert before is not None
    refused = engine.evaluate([charged, refusing], now=T0 + 0.25)
    assert not refused.allowed
    assert refused.results[0].outcome is Outcome.SPARED
    after = _state(client, charged, T0 + 0.25)
    if algorithm == "token_bucket":  # the charge refilled the bucket to its own time first
        tokens, ts = float(before[b"t"]), float(before[b"ts"])
        refilled = min(4, tokens + (to_us(T0 + 0.25) - ts) * 4 / period_us(charged))
        assert float(after[b"t"]) == pytest.approx(refilled, abs=1e-9)
        assert float(after[b"ts"]) == to_us(T0 + 0.25)
    else:
        assert after == before


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "leaky_bucket"])
def test_a_refund_late_behind_another_request_never_gives_away_capacity(client, engine,
                                                                        algorithm):
    # A charge at T0, then another request at T0 + 5 (the bucket idle in between: without
    # the charge it would have restarted from T0 + 5), then the charge's refund. Moving the
    # state back by the charge's cost would hand out capacity nobody took, so such a refund
    # must leave the state as it is: the next request is decided as if the charge had
    # never happened, or more strictly, never more leniently.
    limit = Limit("ip:9", algorithm, 1, 1.0, name="late")
    slot = client.keyslot(base_key("rl:", limit))
    keys, args, _ = encode([limit], prefix="rl:", now=T0, stats=False)
    charge = engine._slot(keys=keys, args=args)  # the first slot of a refused request
    twin = MemoryEngine()
    later = engine.evaluate([limit], now=T0 + 5)
    assert later.allowed and twin.evaluate([limit], now=T0 + 5).allowed
    raw = list(charge[2:2 + FIELDS])
    run_flow(engine.refunding([limit], {slot: [0]}, {slot: decode_slot(charge, 1)}, "", raw),
             engine.perform)
    got, want = engine.evaluate([limit], now=T0 + 5.5), twin.evaluate([limit], now=T0 + 5.5)
    assert not want.allowed
    assert got.allowed is False


def test_cluster_and_memory_decide_the_same_multi_limit_requests(client, engine):
    rng = random.Random(14)
    twin = MemoryEngine(version_key="rl:version")
    for round_ in range(6):
        algorithms = tuple(rng.choice(ALGORITHMS) for _ in range(3))
        trio = three_on_three(client, algorithms, tuple(rng.randint(2, 6) for _ in range(3)),
                              period=rng.choice([1.0, 10.0, 60.0]))
        trio = [dataclasses.replace(limit, name=f"{limit.name}-{round_}",
                                    shadow=rng.random() < 0.2) for limit in trio]
        t = T0 + 10_000 * round_
        for _ in range(40):
            t += rng.choice([0.0, 0.001, 0.05, 0.3, 1.0, 7.0])
            request = [dataclasses.replace(limit, cost=rng.randint(1, 2))
                       for limit in rng.sample(trio, rng.randint(1, 3))]
            got, want = engine.evaluate(request, now=t), twin.evaluate(request, now=t)
            assert got.allowed == want.allowed, (round_, t, request)
            assert [(r.outcome, r.remaining) for r in got.results] == \
                [(r.outcome, r.remaining) for r in want.results], (round_, t, request)
            assert got.retry_after == want.retry_after
            # a refunded bucket was refilled at the charge's instant: the same state, whose
            # waits round up to the µs along another float path (1 µs apart at most)
            assert [r.retry_after for r in got.results] == \
                pytest.approx([r.retry_after for r in want.results], abs=2e-6)
            if got.token:
                engine.release(got)
                twin.release(want)


# -- the engine's other duties on the cluster -------------------------------------------


def test_counters_and_offenders_are_tallied_and_flushed(client, engine):
    ip, user, glob = three_on_three(client)
    for i in range(6):
        engine.evaluate([ip, user, glob], now=T0 + i)
    minute, hour = int(T0 // 60), int(T0 // 3600)
    assert engine.counters("per-user", minute) == {"a": 3, "r": 3}
    assert engine.counters_many([("per-ip", minute), (glob.name, minute)]) == [
        {"a": 3, "o": 3}, {"a": 3, "o": 3}]
    assert engine.offenders("per-user", hour) == [(user.key, 3)]
    assert engine.offenders("per-ip", hour) == []
    # read by another engine: the counts are in the cluster, not only in this process
    other = ClusterEngine(client)
    assert other.counters("per-user", minute) == {"a": 3, "r": 3}
    assert other.offenders("per-user", hour) == [(user.key, 3)]


def beside_version(client, beside: bool, limits=None, prefix: str = "rl:") -> Limit:
    """The first of `limits` (by default per-client fixed windows) whose key sits on the
    version key's node (`beside`), or on another."""
    home = client.get_node_from_key(f"{prefix}version").name
    candidates = limits or (Limit(f"ip:{i}", "fixed_window", 5, 60, name="p")
                            for i in range(10_000))
    for limit in candidates:
        if (client.get_node_from_key(base_key(prefix, limit)).name == home) == beside:
            return limit
    raise AssertionError("no such key")


def test_a_version_bump_is_seen_by_the_next_request(client, engine):
    """The version rides along where it costs no node more: a decision on the version
    key's node carries it, as does a call with no limit."""
    limit = beside_version(client, beside=True)
    assert engine.evaluate([limit], now=T0).version == 0
    version = engine.bump_version()
    assert version > 0
    assert engine.evaluate([limit], now=T0).version == version
    assert engine.evaluate([], now=T0).version == version


def test_a_decision_on_other_nodes_leaves_the_version_to_a_read(client, engine):
    """A decision whose keys sit on other nodes than the version's is not sent to that
    node as well: it carries no version (the pipeline then reads it now and then, one
    GET), and the version's node counts no command for it."""
    limit = beside_version(client, beside=False)
    home = client.get_node_from_key("rl:version")
    version = engine.bump_version()
    before = client.get_redis_connection(home).info("commandstats").get("cmdstat_get", {})
    decision = engine.evaluate([limit], now=T0)
    after = client.get_redis_connection(home).info("commandstats").get("cmdstat_get", {})
    assert decision.allowed and decision.version is None
    assert after.get("calls", 0) == before.get("calls", 0)
    assert engine.read_version() == version


def test_lost_scripts_are_loaded_again(client, engine):
    limit = Limit("ip:1", "sliding_log", 2, 60, name="p")
    assert engine.evaluate([limit], now=T0).allowed
    for node in client.get_primaries():
        client.get_redis_connection(node).script_flush()
    assert engine.evaluate([limit], now=T0 + 1).results[0].remaining == 0
    assert not engine.evaluate([limit], now=T0 + 2).allowed


def test_held_slots_across_primaries_are_released_and_renewed(client, engine):
    a, b, _ = three_on_three(client, ("concurrency", "concurrency", "fixed_window"), (1, 1, 9))
    held = engine.evaluate([a, b], now=T0)
    assert held.allowed and held.token
    assert not engine.evaluate([a, b], now=T0 + 1).allowed
    engine.renew([held], now=T0 + 50)  # kept past its first period (60 s)
    assert not engine.evaluate([a], now=T0 + 70).allowed
    engine.release(held)
    assert engine.evaluate([a, b], now=T0 + 71).allowed


def test_reset_forgets_one_client_on_its_node(client, engine):
    limit = Limit("ip:1", "fixed_window", 1, 60, name="p")
    assert engine.evaluate([limit], now=T0).allowed
    assert not engine.evaluate([limit], now=T0 + 1).allowed
    engine.reset(limit, now=T0 + 1)
    assert engine.evaluate([limit], now=T0 + 2).allowed


def test_warm_up_lives_beside_its_key_and_is_reset_with_it(client, engine):
    limit = Limit("ip:2", "gcra", 1, 1, burst=2, warmup=4, name="w")
    assert engine.evaluate([limit], now=T0).allowed
    assert not engine.evaluate([limit], now=T0 + 1).allowed  # paced: a third of the rate
    for at in (3, 4.5, 4.5):  # warm, then the burst
        assert engine.evaluate([limit], now=T0 + at).allowed
    engine.reset(limit, now=T0 + 6.5)
    assert engine.evaluate([limit], now=T0 + 6.5).allowed
    assert not engine.evaluate([limit], now=T0 + 6.5).allowed  # cold again


# -- eight processes racing -------------------------------------------------------------


def _race(ports: list[int], trio: list[Limit], start: float, out) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=ports[0])
    engine = ClusterEngine(client)
    while time.time() < start:  # line the processes up on one instant
        pass
    admitted = refused = 0
    for _ in range(25):
        if engine.evaluate(trio).allowed:
            admitted += 1
        else:
            refused += 1
    engine.close()
    out.put((admitted, refused))


def test_eight_processes_on_three_primaries_admit_exactly_the_limit(cluster, client):
    # sliding logs: exact, and each charge is a set of named members anyone can count
    trio = three_on_three(client, ("sliding_log",) * 3, (40, 25, 60), period=3600)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_race, args=(cluster.ports, trio, start, out))
             for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    admitted = sum(a for a, _ in results)
    refused = sum(r for _, r in results)
    assert admitted == 25  # the user limit, exactly, across 8 processes
    assert refused == 8 * 25 - 25
    # no policy holds a charge for a request another refused
    for limit in trio:
        assert client.zcard(base_key("rl:", limit)) == 25, limit.name
    # every process flushed its tally at close()
    reader = ClusterEngine(client)
    minutes = range(int(start // 60) - 1, int(time.time() // 60) + 1)
    totals = {name: {} for name in ("per-ip", "per-user", trio[2].name)}
    for name, counts in totals.items():
        for got in reader.counters_many([(name, m) for m in minutes]):
            for field, n in got.items():
                counts[field] = counts.get(field, 0) + n
    assert totals["per-user"] == {"a": 25, "r": refused}
    assert totals["per-ip"] == {"a": 25, "o": refused}
    assert totals[trio[2].name] == {"a": 25, "o": refused}
    hours = {int(start // 3600), int(time.time() // 3600)}
    assert sum(n for h in hours for _, n in reader.offenders("per-user", h)) == refused


# -- an outage ----------------------------------------------------------------------------


def test_a_cluster_out_of_reach_raises_engine_unavailable_and_opens_the_breaker():
    small = RedisCluster(replicas=0).start()  # its own: this test stops it
    try:
        client = _client(small)
        breaker = CircuitBreaker(failures=2, cooldown=60)
        engine = ClusterEngine(client, version_key="rl:version", breaker=breaker)
        limits = [Limit(f"ip:{i}", "fixed_window", 5, 60, name=f"p{i}") for i in range(3)]
        assert engine.evaluate(limits).allowed
    finally:
        small.stop()
    started = time.monotonic()
    for _ in range(2):
        with pytest.raises(EngineUnavailable):
            engine.evaluate(limits)
    assert breaker.state == "open"
    with pytest.raises(EngineUnavailable, match="circuit open"):
        engine.evaluate(limits)  # fails fast, touching no socket
    for call in (lambda: engine.counters("p0", 0), engine.bump_version,
                 lambda: engine.reset(limits[0], now=T0)):
        with pytest.raises(EngineUnavailable):
            call()
    engine.close()  # the tally stays unsent; closing does not raise
    assert time.monotonic() - started < 30


def test_limits_apply_again_once_a_replica_took_over_a_killed_primary():
    small = RedisCluster().start()  # its own: this test kills one of its primaries
    try:
        client = _client(small)
        engine = ClusterEngine(client)
        limit = Limit("ip:7", "sliding_log", 3, 3600, name="p")
        assert engine.evaluate([limit]).allowed
        node = client.get_node_from_key(base_key("rl:", limit))
        port = int(node.port)
        wait_replicated(client.get_redis_connection(node))  # the replica has it
        small.kill(port)  # kill -9: what the primary had not replicated is lost
        outcomes: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                decision = engine.evaluate([limit])
            except EngineUnavailable:
                outcomes.append("unavailable")
            else:
                outcomes.append("decided")
                break
            finally:
                assert time.monotonic() - started < 5  # never a long wait
        assert outcomes[-1] == "decided", outcomes
        assert outcomes[0] == "unavailable"
        assert int(client.get_node_from_key(base_key("rl:", limit)).port) != port
        # the replica had the first charge: the limit goes on from there
        assert decision.results[0].remaining == 1
        assert engine.evaluate([limit]).allowed
        assert not engine.evaluate([limit]).allowed
        engine.close()
    finally:
        small.stop()


def test_a_quiet_process_still_sends_its_last_counts(client, engine):
    """No request after the last one: the tally reaches the cluster within FLUSH_EVERY
    anyway (read straight from the cluster: counters() would flush first)."""
    from ratelimits.engine.tally import FLUSH_EVERY

    limit = Limit("ip:1", "fixed_window", 1, 60, name="quiet")
    engine.evaluate([limit], now=T0)
    engine.evaluate([limit], now=T0 + 1)  # and then nothing more
    key = stats_key("rl:", "quiet", int(T0 // 60))
    deadline = time.monotonic() + FLUSH_EVERY + 5
    seen = {}
    while time.monotonic() < deadline:  # a background flush, not a window: poll it
        seen = {k.decode(): int(v) for k, v in client.hgetall(key).items()}
        if seen == {"a": 1, "r": 1}:
            break
        time.sleep(0.05)
    assert seen == {"a": 1, "r": 1}
