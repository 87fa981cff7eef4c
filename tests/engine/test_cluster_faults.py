"""ClusterEngine while the cluster's topology changes under traffic, on a real cluster:
slots migrated between primaries (MIGRATING / IMPORTING, MIGRATE, SETSLOT NODE) while
eight processes race, and a primary killed with SIGKILL while several processes decide,
its replica promoted. Exactness, the errors callers see, how long a call may take, and
what a failover loses, counted per admitted request."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
from collections.abc import Callable

import pytest
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import EngineUnavailable, Limit
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.cluster_fanout import REFRESH_EVERY
from ratelimits.engine.keynames import base_key
from ratelimits.engine.registry import ALGORITHMS
from tests.engine.conftest import T0
from tests.engine.test_cluster_engine import three_on_three
from tests.redis_cluster import RedisCluster
from tests.support.fixtures import own_cluster

pytestmark = pytest.mark.slow

#: The limiter's own client options (as `engine.deployments.cluster_client` builds them).
TIMEOUT = 0.5


def _client(ports: list[int]) -> redis.cluster.RedisCluster:
    seeds = [redis.cluster.ClusterNode("127.0.0.1", p) for p in ports]
    return redis.cluster.RedisCluster(startup_nodes=seeds, socket_timeout=TIMEOUT,
                                      socket_connect_timeout=TIMEOUT,
                                      retry=Retry(NoBackoff(), 0))


def _node_id(cluster: RedisCluster, port: int) -> str:
    raw = cluster.client(port).execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _errorstat(cluster: RedisCluster, port: int, prefix: str) -> int:
    """How many error replies starting with `prefix` (ASK, MOVED, TRYAGAIN) a node sent."""
    stats = cluster.client(port).info("errorstats")
    return int(stats.get(f"errorstat_{prefix}", {}).get("count", 0))


def migrate_slot(cluster: RedisCluster, slot: int, source: int, target: int,
                 between: Callable[[str], None] = lambda phase: None) -> None:
    """Move one slot from the primary on `source` to the one on `target`, the way
    `redis-cli --cluster reshard` does, calling `between(phase)` in each state."""
    src, dst = cluster.client(source), cluster.client(target)
    src_id, dst_id = _node_id(cluster, source), _node_id(cluster, target)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    try:
        between("migrating")  # the keys still on the source
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        between("moved")  # the keys on the target, the slot still the source's
    except BaseException:  # leave the slot where it was for the next test
        for node in (src, dst):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        raise
    dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    for port in cluster.primary_ports():
        if port not in (source, target):
            cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    between("owned")  # the target owns the slot; stale slot maps get MOVED


@pytest.fixture(scope="module")
def cluster():
    """A cluster of this module's own, not the run's shared one: its tests move slots
    from primary to primary and leave them there."""
    with own_cluster() as started:
        yield started


@pytest.fixture
def client(cluster):
    c = _client(cluster.ports)
    c.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    yield c
    c.close()


def _port(client, limit: Limit) -> int:
    return int(client.get_node_from_key(base_key("rl:", limit)).port)


def _other_primary(cluster: RedisCluster, port: int, shift: int = 1) -> int:
    primaries = sorted(cluster.primary_ports())
    return primaries[(primaries.index(port) + shift) % len(primaries)]


# -- a window counter during a migration ----------------------------------------------


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "sliding_log",
                                       "gcra", "token_bucket"])
def test_a_migrating_slot_never_restarts_a_limit_from_zero(cluster, client, algorithm):
    # A limit of 3, two charged before the slot starts migrating: however the calls are
    # redirected while its keys move, exactly one more request may pass. A windowed
    # limit's counts live in its window keys, not in its base key: between MIGRATING and
    # the slot's hand-over no node can decide it exactly (the source answers TRYAGAIN
    # while the keys are there, the importing node while its base key, which never
    # exists, is not), so the call raises EngineUnavailable (the policy's on_error
    # decides) instead of counting from zero.
    engine = ClusterEngine(client)
    limit = Limit(f"ip:mig-{algorithm}", algorithm, 3, 60, name=f"mig-{algorithm}")
    assert engine.evaluate([limit], now=T0).allowed
    assert engine.evaluate([limit], now=T0 + 0.001).allowed
    source = _port(client, limit)
    seen: dict[str, str] = {}

    def between(phase: str) -> None:
        try:
            allowed = engine.evaluate([limit], now=T0 + 0.002).allowed
        except EngineUnavailable:
            seen[phase] = "unavailable"
        else:
            seen[phase] = "admitted" if allowed else "refused"

    migrate_slot(cluster, client.keyslot(base_key("rl:", limit)), source,
                 _other_primary(cluster, source), between)
    windowed = algorithm in ("fixed_window", "sliding_window")
    if windowed:
        assert seen == {"migrating": "unavailable", "moved": "unavailable",
                        "owned": "admitted"}
    else:
        assert seen == {"migrating": "admitted", "moved": "refused", "owned": "refused"}
    assert not engine.evaluate([limit], now=T0 + 0.003).allowed
    engine.close()


# -- held slots released after their hash slot moved ------------------------------------


@pytest.mark.parametrize("when", ["moved", "owned"])
@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_held_slots_are_released_where_their_hash_slot_went(cluster, client, driver, when):
    """A request holds a concurrency slot while its hash slot moves to another primary:
    released once the key has moved (the source answers ASK) or once the target owns the
    slot (MOVED, to a slot map that has not seen it), the slot is freed where the key now
    lives, by the blocking engine and its asyncio twin alike."""
    from ratelimits.engine.aio import AsyncClusterEngine
    from ratelimits.engine.deployments import async_twin_client

    engine = ClusterEngine(client)
    limit = Limit(f"ip:{driver}-{when}", "concurrency", 1, 60, name="slots")
    held = engine.evaluate([limit], now=T0)
    assert held.allowed and held.token
    key = base_key("rl:", limit)
    source = _port(client, limit)
    target = _other_primary(cluster, source)

    def release() -> None:
        if driver == "blocking":
            engine.release(held)
        else:
            asyncio.run(AsyncClusterEngine(engine, async_twin_client).release(held))

    migrate_slot(cluster, client.keyslot(key), source, target,
                 between=lambda phase: release() if phase == when else None)

    assert cluster.client(target).zcard(key) == 0  # freed where the key lives
    assert engine.evaluate([limit], now=T0 + 1).allowed  # the one slot is free again
    engine.close()


# -- a reshard while eight processes race ---------------------------------------------


def _racer(ports, trio, start, stop, calls, out) -> None:
    engine = ClusterEngine(_client(ports))
    while time.time() < start:  # line the processes up on one instant
        pass
    admitted = refused = 0
    errors: dict[str, int] = {}
    while True:
        try:
            decision = engine.evaluate(trio)
        except Exception as exc:  # counted: the test expects none
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            continue
        finally:
            with calls.get_lock():
                calls.value += 1
        if decision.allowed:
            admitted += 1
        else:
            refused += 1
            if stop.is_set():  # the limit is spent after the reshard: done
                break
    engine.close()
    out.put((admitted, refused, errors))


def _wait_for(calls, more: int, timeout: float = 60.0) -> None:
    """Until the racers made `more` further calls (progress, not a clock)."""
    target = calls.value + more
    deadline = time.monotonic() + timeout
    while calls.value < target:
        assert time.monotonic() < deadline, "the racers stopped making calls"
        time.sleep(0.002)


def _wait_until(condition, message: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.002)


def test_eight_processes_stay_exact_while_their_slots_are_resharded(cluster, client):
    user_limit = 5000
    trio = three_on_three(client, ("sliding_log",) * 3, (6000, user_limit, 8000), period=3600)
    slots = [client.keyslot(base_key("rl:", limit)) for limit in trio]
    sources = [_port(client, limit) for limit in trio]
    asks_before = sum(_errorstat(cluster, p, "ASK") for p in sources)
    ctx = multiprocessing.get_context("fork")
    out, stop, calls = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    start = time.time() + 0.5
    procs = [ctx.Process(target=_racer, args=(cluster.ports, trio, start, stop, calls, out))
             for _ in range(8)]
    for p in procs:
        p.start()
    try:
        _wait_for(calls, 20)
        # every slot of the race moves on to the next primary, under traffic
        for slot, source in zip(slots, sources, strict=True):
            migrate_slot(cluster, slot, source, _other_primary(cluster, source),
                         lambda phase: _wait_for(calls, 15))
        during = calls.value
        stop.set()
        results = [out.get(timeout=120) for _ in procs]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
    assert during < user_limit  # every phase of the reshard ran while requests admitted
    errors: dict[str, int] = {}
    for _, _, errs in results:
        for name, n in errs.items():
            errors[name] = errors.get(name, 0) + n
    assert errors == {}  # no error reached a caller
    assert sum(a for a, _, _ in results) == user_limit  # exact, across the reshard
    # the calls really were redirected while the keys moved
    assert sum(_errorstat(cluster, p, "ASK") for p in sources) > asks_before
    # state: each key on its new primary, holding one unit per admitted request
    fresh = _client(cluster.ports)
    for limit, source in zip(trio, sources, strict=True):
        assert _port(fresh, limit) == _other_primary(cluster, source)
        assert fresh.zcard(base_key("rl:", limit)) == user_limit, limit.name
    fresh.close()


# -- kill -9 of a primary under traffic -----------------------------------------------


def _worker(ports, limit, stop, decided, ready, out) -> None:
    try:
        _work(ports, limit, stop, decided, ready, out)
    except BaseException:  # reported: the test shows it instead of "never reported"
        import traceback

        out.put(({"crashed": 1}, [traceback.format_exc()], [], 0.0, 0.0))
        raise


def _work(ports, limit, stop, decided, ready, out) -> None:
    engine = ClusterEngine(_client(ports))
    first = True
    outcomes: dict[str, int] = {}
    errors: list[str] = []  # the last few messages
    admitted: list[float] = []  # when each admitted call started
    decided_at = slowest = 0.0
    give_up = None
    while True:
        started = time.monotonic()
        if stop.is_set():
            give_up = give_up or started + 30
            if started > give_up:  # reported: the test fails on it
                outcomes["still failing at the end"] = 1
                break
        try:
            decision = engine.evaluate([limit])
        except Exception as exc:
            outcome = type(exc).__name__
            errors = [*errors[-4:], f"{outcome}: {exc}"]
        else:
            outcome = "admitted" if decision.allowed else "refused"
            decided_at = started
            if decision.allowed:
                admitted.append(started)
            with decided.get_lock():
                decided.value += 1
            if first:  # this process has its client and its slot map
                first = False
                with ready.get_lock():
                    ready.value += 1
        slowest = max(slowest, time.monotonic() - started)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == "refused" and stop.is_set():
            break
    engine.close()
    out.put((outcomes, errors, admitted, decided_at, slowest))


def test_a_primary_killed_under_traffic_fails_fast_then_limits_apply_again(capsys):
    small = RedisCluster().start()  # its own: this test kills one of its primaries
    limit_n = 300
    limit = Limit("ip:killed", "sliding_log", limit_n, 3600, name="killed")
    ctx = multiprocessing.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    decided, ready = ctx.Value("i", 0), ctx.Value("i", 0)
    procs = [ctx.Process(target=_worker, args=(small.ports, limit, stop, decided, ready, out))
             for _ in range(4)]
    try:
        client = _client(small.ports)
        victim = _port(client, limit)
        for p in procs:
            p.start()
        # every process built its client before the kill: a cluster client built while
        # the nodes disagree about a failover may fail to start, which is not under test
        _wait_until(lambda: ready.value == len(procs), "a process never decided")
        _wait_for(decided, 40)
        small.kill(victim)  # SIGKILL: what it had not yet replicated is lost
        killed_at = time.monotonic()
        small.wait_ok()  # the replica promoted, every live node agrees
        _wait_for(decided, 20)
        stop.set()
        logs = []
        for _ in procs:
            try:
                logs.append(out.get(timeout=60))
            except queue.Empty:
                pytest.fail(f"a process never reported: exit codes "
                            f"{[p.exitcode for p in procs]}")
        for p in procs:
            p.join(timeout=30)
        fresh = _client([p for p in small.ports if p != victim])
        assert _port(fresh, limit) != victim
        held = fresh.zcard(base_key("rl:", limit))
        fresh.close()
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        small.stop()
    outcomes: dict[str, int] = {}
    for counts, *_ in logs:
        for name, n in counts.items():
            outcomes[name] = outcomes.get(name, 0) + n
    errors = [e for _, errs, *_ in logs for e in errs]
    assert "crashed" not in outcomes, "\n".join(e for e in errors if e.startswith("Traceback"))
    # nothing but EngineUnavailable raised, and every process decided again at the end
    assert set(outcomes) == {"admitted", "refused", "EngineUnavailable"}, (outcomes, errors)
    # never a long wait: the timeouts (connect + read) and one slot-map refresh
    slowest = max(s for *_, s in logs)
    assert slowest < 2 * TIMEOUT + REFRESH_EVERY + 1.0, slowest
    # limits apply again on the promoted replica: it holds exactly the limit
    assert held == limit_n
    for _, _, _, decided_at, _ in logs:
        assert decided_at > killed_at
    admitted = [t for _, _, times, _, _ in logs for t in times]
    before = sum(1 for t in admitted if t < killed_at)
    # Admitted by callers minus held by the new primary: the admissions the old primary
    # made but never replicated (the new one then admitted that many more than the limit),
    # less any call the old primary ran and replicated whose reply the kill cut off (its
    # caller got EngineUnavailable): at most one per process.
    over = len(admitted) - held
    assert -len(procs) <= over <= before
    unavailable = outcomes["EngineUnavailable"]
    with capsys.disabled():
        print(f"\nkill -9 of a primary: admitted by callers - held after failover = {over} "
              f"({before} admitted before the kill); {unavailable} calls raised "
              f"EngineUnavailable; slowest call {slowest * 1000:.0f} ms")


def test_a_primary_out_of_reach_leaves_nothing_charged_on_the_others():
    """A request whose limits live on two primaries, one of them dead: the call fails as
    unavailable, and the primary that charged gives the units back (all or nothing). The
    live primary meets each script for the first time: it gets it as EVAL, since loading a
    script through the cluster client needs every primary, the dead one included."""
    small = RedisCluster(replicas=0).start()  # no replica: the dead primary stays dead
    try:
        client = _client(small.ports)
        victim = small.ports[0]
        engine = ClusterEngine(_client(small.ports))

        def placed(algorithm: str, name: str, on: Callable[[int], bool]) -> Limit:
            for i in range(10_000):
                limit = Limit(f"ip:198.51.100.{i}", algorithm, 5, 60, name=name)
                if on(_port(client, limit)):
                    return limit
            raise AssertionError("no key on the wanted primary")

        small.kill(victim)
        for algorithm in ALGORITHMS:
            alive = placed(algorithm, f"alive-{algorithm}", lambda p: p != victim)
            twin = placed(algorithm, f"twin-{algorithm}", lambda p: p != victim)
            dead = placed(algorithm, f"dead-{algorithm}", lambda p: p == victim)
            # the live primary's node is written first: it charges before the dead one fails
            with pytest.raises(EngineUnavailable):
                engine.evaluate([alive, dead], now=T0)
            after = engine.evaluate([alive], now=T0 + 1).results[0]
            fresh = engine.evaluate([twin], now=T0 + 1).results[0]
            assert after.remaining == fresh.remaining, algorithm
        engine.close()
        client.close()
    finally:
        small.stop()
