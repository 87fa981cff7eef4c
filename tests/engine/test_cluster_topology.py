"""ClusterEngine while an operator changes the cluster's topology under traffic, on a real
cluster of the test's own: `redis-cli --cluster reshard` moving slots to a primary just
added with `redis-cli --cluster add-node`, and a primary restarted on another port (same
node id, same data). Exactness, the errors callers see, how long a call may take, and
whether the engine reaches the new node without a restart."""

from __future__ import annotations

import multiprocessing
import queue
import subprocess
import time
from collections.abc import Callable

import pytest
from redis.crc import key_slot

from ratelimits.engine import Limit
from ratelimits.engine.cluster import ClusterEngine
from ratelimits.engine.cluster_fanout import REFRESH_EVERY
from ratelimits.engine.keynames import base_key
from tests.engine.test_cluster_faults import TIMEOUT, _client, _errorstat, _racer, _wait_for
from tests.redis_cluster import RedisCluster
from tests.redis_server import cli_binary

pytestmark = pytest.mark.slow


def _slot(limit: Limit) -> int:
    return int(key_slot(base_key("rl:", limit).encode()))


def _limit_on(slots: set[int], make: Callable[[int], Limit]) -> Limit:
    """The first `make(i)` whose key falls in one of `slots`."""
    for i in range(1_000_000):
        limit = make(i)
        if _slot(limit) in slots:
            return limit
    raise AssertionError(f"no key in slots {sorted(slots)}")


def _owned(cluster: RedisCluster, port: int) -> list[int]:
    """The slots the primary on `port` serves, lowest first, as it says itself."""
    me = next(v for v in cluster.nodes(port).values() if "myself" in v.flags)
    out: list[int] = []
    for part in me.slots:
        if part.startswith("["):  # a slot being imported or migrated: not owned yet
            continue
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return sorted(out)


def _sum(dicts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for name, n in d.items():
            total[name] = total.get(name, 0) + n
    return total


# -- redis-cli --cluster reshard to a new primary, eight processes racing ----------------

#: Slots `redis-cli --cluster reshard` moves: it takes about a third from each source,
#: each source's lowest slots first.
RESHARD_SLOTS = 60
#: The race's keys sit among the lowest this many slots of each source, so they move.
LOWEST = 10


def test_redis_cli_reshard_to_a_new_primary_keeps_eight_racing_processes_exact(capsys):
    small = RedisCluster(replicas=0).start()  # its own: it gains a primary
    user_limit = 8000  # outlasts the reshard even on a loaded machine
    ctx = multiprocessing.get_context("fork")
    out, stop, calls = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        sources = sorted(small.primary_ports())
        new = small.add_node()  # empty; every node knows it
        assert _owned(small, new) == []
        # one limit on each source, among the slots the reshard will move first
        makers: list[Callable[[int], Limit]] = [
            lambda i: Limit(f"ip:198.51.100.{i}", "sliding_log", 12000, 3600, name="per-ip"),
            lambda i: Limit(f"user:{i}", "sliding_log", user_limit, 3600, name="per-user"),
            lambda i: Limit("global", "sliding_log", 15000, 3600, name=f"global-{i}"),
        ]
        trio = [_limit_on(set(_owned(small, port)[:LOWEST]), make)
                for port, make in zip(sources, makers, strict=True)]
        client = _client(small.ports)
        assert sorted(int(client.get_node_from_key(base_key("rl:", lim)).port)
                      for lim in trio) == sources
        client.close()
        moved_before = sum(_errorstat(small, p, "MOVED") for p in sources)
        asks_before = sum(_errorstat(small, p, "ASK") for p in sources)

        start = time.time() + 0.5
        procs = [ctx.Process(target=_racer, args=(small.ports, trio, start, stop, calls, out))
                 for _ in range(8)]
        for p in procs:
            p.start()
        _wait_for(calls, 20)
        before = calls.value
        began = time.monotonic()
        reshard = subprocess.run(
            [cli_binary(), "--cluster", "reshard",
             f"127.0.0.1:{sources[0]}",
             "--cluster-from", ",".join(small.node_id(p) for p in sources),
             "--cluster-to", small.node_id(new),
             "--cluster-slots", str(RESHARD_SLOTS), "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        took = time.monotonic() - began
        during = calls.value
        assert reshard.returncode == 0, reshard.stdout + reshard.stderr
        _wait_for(calls, 20)  # and on after it, on the new primary
        stop.set()
        results = []
        for _ in procs:
            try:
                results.append(out.get(timeout=120))
            except queue.Empty:
                pytest.fail(f"a process never reported: exit codes "
                            f"{[p.exitcode for p in procs]}")
        for p in procs:
            p.join(timeout=30)

        # the race's slots are among those redis-cli moved: the new primary owns them
        owned = set(_owned(small, new))
        assert RESHARD_SLOTS - len(sources) <= len(owned) <= RESHARD_SLOTS
        assert {_slot(lim) for lim in trio} <= owned
        moved = sum(_errorstat(small, p, "MOVED") for p in sources) - moved_before
        asks = sum(_errorstat(small, p, "ASK") for p in sources) - asks_before
        fresh = _client(small.ports)
        held = {lim.name: fresh.zcard(base_key("rl:", lim)) for lim in trio}
        on_new = {lim.name: int(fresh.get_node_from_key(base_key("rl:", lim)).port) == new
                  for lim in trio}
        fresh.close()
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        small.stop()
    assert before < during < user_limit  # the racers were admitting all through the reshard
    assert _sum([errs for _, _, errs in results]) == {}  # no error reached a caller
    assert sum(a for a, _, _ in results) == user_limit  # exact, across the reshard
    assert moved > 0  # the racers' slot maps were stale afterwards: redirected, not wrong
    # each key whole on the new primary, one unit per admitted request (the refused ones
    # were refunded on the other two limits)
    assert on_new == {lim.name: True for lim in trio}
    assert held == {lim.name: user_limit for lim in trio}
    with capsys.disabled():
        print(f"\nredis-cli --cluster reshard of {len(owned)} slots to a new primary: "
              f"{took * 1000:.0f} ms, {during - before} calls by 8 processes meanwhile, "
              f"{moved} MOVED and {asks} ASK answered, no error, exactly {user_limit} "
              "admitted")


# -- a primary restarted on another port -------------------------------------------------


def _decider(ports, limits, stop, decided, out) -> None:
    """Decide `limits` until told to stop and the first of them is spent; report."""
    engine = ClusterEngine(_client(ports))
    outcomes: dict[str, int] = {}
    errors: list[str] = []  # the last few messages
    failed: list[float] = []  # first and last failure
    admitted_at: list[float] = []
    slowest = 0.0
    give_up = None
    while True:
        started = time.monotonic()
        if stop.is_set():
            give_up = give_up or started + 30
            if started > give_up:  # reported: the test fails on it
                outcomes["still failing at the end"] = 1
                break
        try:
            decision = engine.evaluate(limits)
        except Exception as exc:
            outcome = type(exc).__name__
            errors = [*errors[-4:], f"{outcome}: {exc}"]
            failed = [failed[0] if failed else started, started]
        else:
            outcome = "admitted" if decision.allowed else "refused"
            if decision.allowed:
                admitted_at.append(started)
            with decided.get_lock():
                decided.value += 1
        slowest = max(slowest, time.monotonic() - started)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == "refused" and stop.is_set():
            break
    port = int(engine.client.get_node_from_key(base_key("rl:", limits[0])).port)
    engine.close()
    out.put((outcomes, errors, failed, admitted_at, slowest, port))


def _epoch(cluster: RedisCluster, port: int) -> int:
    raw = cluster.client(port).execute_command("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return int(text.split("cluster_current_epoch:")[1].split()[0])


def test_a_primary_restarted_on_another_port_is_found_without_a_restart(capsys):
    small = RedisCluster().start()  # its own: one of its primaries moves
    limit_n = 2000
    ctx = multiprocessing.get_context("fork")
    out, stop, decided = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    procs: list[multiprocessing.process.BaseProcess] = []
    try:
        client = _client(small.ports)
        # a request with two limits: one on the primary that moves, one on another
        limit = Limit("ip:moved", "sliding_log", limit_n, 3600, name="moved")
        old = int(client.get_node_from_key(base_key("rl:", limit)).port)
        beside = _limit_on(set(range(16384)) - set(_owned(small, old)),
                           lambda i: Limit(f"user:{i}", "sliding_log", 10**6, 3600,
                                           name="beside"))
        client.close()
        node = small.node_id(old)
        replicas = {v.node_id: v.port for v in small.nodes(old).values()
                    if v.primary_id == node}
        assert replicas
        for port in replicas.values():  # a planned move, not a failure: no failover
            small.client(port).config_set("cluster-replica-no-failover", "yes")
        epoch = _epoch(small, old)

        procs = [ctx.Process(target=_decider,
                             args=(small.ports, [limit, beside], stop, decided, out))
                 for _ in range(4)]
        for p in procs:
            p.start()
        _wait_for(decided, 40)
        moving = time.monotonic()
        new = small.move_node(old)
        small.wait_agree()  # every node knows the new address; the cluster is ok
        _wait_for(decided, 20)  # the processes decide again
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

        views = small.nodes(new)
        fresh = _client([new])
        held = fresh.zcard(base_key("rl:", limit))
        held_beside = fresh.zcard(base_key("rl:", beside))
        serving = int(fresh.get_node_from_key(base_key("rl:", limit)).port)
        fresh.close()
        # everything the moved node ran since it came back ran on the new port
        evalsha = small.client(new).info("commandstats").get("cmdstat_evalsha", {})
        epoch_after = _epoch(small, new)
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        small.stop()
    outcomes = _sum([o for o, *_ in logs])
    errors = [e for _, errs, *_ in logs for e in errs]
    # the same node, still the primary of its slots, its replicas still its own: no
    # failover happened (the epoch a failover would bump is unchanged)
    assert new != old and serving == new
    assert "master" in views[node].flags and views[node].port == new
    assert all(views[replica].primary_id == node for replica in replicas)
    assert epoch_after == epoch
    # during the gap nothing but EngineUnavailable, and there was a gap
    assert set(outcomes) == {"admitted", "refused", "EngineUnavailable"}, (outcomes, errors)
    # never a long wait: the timeouts (connect + read) and one slot-map refresh
    slowest = max(log[4] for log in logs)
    assert slowest < 2 * TIMEOUT + REFRESH_EVERY + 1.0, slowest
    # every process found the new port by itself and decided there
    assert {log[5] for log in logs} == {new}
    assert int(evalsha.get("calls", 0)) > 0
    # the counts were kept: exactly the limit admitted in all, the part before the move
    # included (had the node come back empty, it would have admitted the limit again)
    admitted = sorted(t for log in logs for t in log[3])
    before = sum(1 for t in admitted if t < moving)
    assert 0 < before < limit_n
    assert len(admitted) == held == limit_n
    # a call that raised may have charged the limit on the node that answered: never
    # fewer units there than admissions, never more extra than calls that raised
    unavailable = outcomes["EngineUnavailable"]
    extra = held_beside - len(admitted)
    assert 0 <= extra <= unavailable
    gap = max(log[2][1] for log in logs if log[2]) - min(log[2][0] for log in logs if log[2])
    with capsys.disabled():
        print(f"\na primary restarted on another port: {gap * 1000:.0f} ms from the first "
              f"failed call to the last; {unavailable} calls raised EngineUnavailable "
              f"(4 processes, no breaker); slowest call {slowest * 1000:.0f} ms; "
              f"{before} admitted before the move, exactly {limit_n} in all; "
              f"{extra} units charged beside by calls that raised")
