"""The asyncio engine: the same decisions as the blocking one, from the same script."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimits.engine import ALGORITHMS, EngineUnavailable, Limit, RedisEngine
from ratelimits.engine.aio import AsyncRedisEngine
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.scripts import batch_library
from tests.engine.conftest import T0


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def twins(url: str, **kwargs) -> tuple[RedisEngine, AsyncRedisEngine]:
    """A blocking engine and an asyncio engine on `url`, each with its own key prefix."""
    blocking = RedisEngine(redis.Redis.from_url(url), prefix="sync:", **kwargs)
    twin = RedisEngine(redis.Redis.from_url(url), prefix="async:", **kwargs)
    return blocking, AsyncRedisEngine(twin, lambda: redis.asyncio.Redis.from_url(url))


def _limit(algorithm: str, client: int, limit: int, period: int, burst: int | None,
           cost: int, shadow: bool) -> Limit:
    spec = REGISTRY[algorithm]
    base = Limit(f"c{client}", algorithm, limit, period,
                 burst=burst if spec.has_burst else None, shadow=shadow, name=algorithm)
    return replace(base, cost=min(cost, base.capacity))


requests = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(ALGORITHMS), st.integers(0, 2), st.integers(1, 5),
                           st.sampled_from([1, 2, 60]), st.none() | st.integers(1, 6),
                           st.integers(1, 3), st.booleans()),
                 min_size=1, max_size=3, unique_by=lambda t: (t[0], t[1])),
        st.integers(0, 3_000_000),  # µs since the previous request
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests)
def test_sync_and_async_engines_decide_alike(redis_url, loop, sequence):
    """The same random requests, at the same explicit times, to both engines: identical
    decisions, field for field (each engine counts under its own prefix)."""
    redis.Redis.from_url(redis_url).flushdb()
    blocking, aio = twins(redis_url, stats=False)
    at = T0
    for specs, gap in sequence:
        at += gap / 1e6
        limits = [_limit(*spec) for spec in specs]
        want = blocking.evaluate(limits, now=at)
        got = loop.run_until_complete(aio.evaluate(limits, now=at))
        assert (got.allowed, got.retry_after, got.delay) == (want.allowed, want.retry_after,
                                                            want.delay)
        assert got.results == want.results
        if want.token is not None:  # concurrency slots: both release theirs
            blocking.release(want)
            loop.run_until_complete(aio.release(got))


def test_each_event_loop_gets_its_own_client(redis_url):
    _, aio = twins(redis_url)
    limit = Limit("c", "fixed_window", 2, 60, name="p")
    clients = []
    for _ in range(2):  # asyncio.run: a new loop each time, as async_to_sync makes
        async def decide():
            decision = await aio.evaluate([limit], now=T0)
            clients.append(aio.client())
            return decision
        assert asyncio.run(decide()).allowed
    assert clients[0] is not clients[1]
    assert not asyncio.run(aio.evaluate([limit], now=T0)).allowed  # one count: 2 of 2


def test_the_decision_runs_on_the_event_loops_thread(redis_url, loop, monkeypatch):
    """No thread hop: the store call is awaited on the loop's own thread."""
    import threading

    _, aio = twins(redis_url)
    limit = Limit("on-the-loop", "gcra", 3, 60, name="p")  # its own key: no other test's
    # the library loaded first, whichever test met the server before: a call that finds
    # it missing asks for the client again to load it
    loop.run_until_complete(aio.evaluate([limit]))
    seen = []
    wire = aio.wire.__func__

    def spy(self):
        seen.append(threading.get_ident())
        return wire(self)

    monkeypatch.setattr(AsyncRedisEngine, "wire", spy)
    loop.run_until_complete(aio.evaluate([limit]))
    assert seen == [threading.get_ident()]


def test_counts_ride_the_async_calls_and_reach_the_counters(redis_url, loop):
    _, aio = twins(redis_url)
    limit = Limit("c", "fixed_window", 2, 60, name="counted")
    for _ in range(3):
        loop.run_until_complete(aio.evaluate([limit], now=T0))
    aio.twin.flush()  # the twin's tally: what the async calls counted
    assert aio.twin.counters("counted", int(T0 // 60)) == {"a": 2, "r": 1}


def test_a_flushed_library_is_loaded_again(redis_url, loop):
    _, aio = twins(redis_url)
    limit = Limit("c", "gcra", 5, 60, name="p")
    assert loop.run_until_complete(aio.evaluate([limit])).allowed
    redis.Redis.from_url(redis_url).function_flush()
    assert loop.run_until_complete(aio.evaluate([limit])).allowed
    # each library is a flat list of name/value pairs
    names = [dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"]
             for lib in redis.Redis.from_url(redis_url).function_list()]
    assert batch_library()[0].encode() in names


def test_without_functions_the_same_script_runs_by_evalsha(private_redis, loop):
    admin = redis.Redis.from_url(private_redis.url)
    admin.acl_setuser("limiter", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-fcall", "-function"])
    url = f"redis://limiter:pw@127.0.0.1:{private_redis.port}/0"
    _, aio = twins(url)
    limit = Limit("c", "sliding_window", 2, 60, name="p")
    got = [loop.run_until_complete(aio.evaluate([limit], now=T0)).allowed for _ in range(3)]
    assert got == [True, True, False]
    assert aio.twin.script.mode == "evalsha"
    admin.script_flush()  # NOSCRIPT: the script is loaded again
    assert not loop.run_until_complete(aio.evaluate([limit], now=T0)).allowed


def _fragile(url: str) -> tuple[RedisEngine, AsyncRedisEngine]:
    """An async engine with the limiter's short timeouts and a breaker, as the app builds."""
    from redis.asyncio.retry import Retry as AsyncRetry

    options = {"socket_timeout": 0.1, "socket_connect_timeout": 0.1}
    twin = RedisEngine(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options),
                       breaker=CircuitBreaker(failures=2, cooldown=60))
    aio = AsyncRedisEngine(twin, lambda: redis.asyncio.Redis.from_url(
        url, retry=AsyncRetry(NoBackoff(), 0), **options))
    return twin, aio


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_a_dead_server_fails_fast_and_the_breaker_opens(private_redis, loop, fault):
    _, aio = _fragile(private_redis.url)
    limit = Limit("c", "gcra", 5, 60, name="p")
    assert loop.run_until_complete(aio.evaluate([limit])).allowed
    if fault == "killed":
        private_redis.proc.send_signal(signal.SIGKILL)
        private_redis.proc.wait()
    else:
        private_redis.proc.send_signal(signal.SIGSTOP)  # accepts, never answers
    try:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(EngineUnavailable):
                loop.run_until_complete(aio.evaluate([limit]))
            assert time.monotonic() - started < 0.5  # the socket timeout, not seconds
        # "circuit open" is raised before any I/O (transport.admit): no socket touched, and
        # no timing to measure on a busy machine
        with pytest.raises(EngineUnavailable, match="circuit open"):
            loop.run_until_complete(aio.evaluate([limit]))
    finally:
        if fault == "paused":
            private_redis.proc.send_signal(signal.SIGCONT)


def test_leased_limits_are_decided_on_the_loop_and_exactly(redis_url, loop, monkeypatch):
    """A limit with `batch` under the async LocalFirst: leases taken with awaited calls on
    the loop's thread, the window's count exact, the same answers as the blocking path."""
    import threading

    from ratelimits.engine.local_first import LocalFirst

    def front(engine: RedisEngine) -> LocalFirst:
        return LocalFirst(engine, clock=lambda: T0)

    blocking, aio = twins(redis_url)
    sync_front, async_front = front(blocking), front(aio.twin)
    async_front.aio = aio
    threads = []
    lease = AsyncRedisEngine.lease

    async def watched(self, *args, **kwargs):
        threads.append(threading.get_ident())
        return await lease(self, *args, **kwargs)

    monkeypatch.setattr(AsyncRedisEngine, "lease", watched)
    leased = Limit("c", "fixed_window", 25, 60, name="leased", batch=10)
    plain = Limit("c", "gcra", 100, 60, name="plain")
    want = [sync_front.evaluate([leased, plain], now=T0 + 1).allowed for _ in range(30)]
    got = [loop.run_until_complete(async_front.aevaluate([leased, plain], now=T0 + 1)).allowed
           for _ in range(30)]
    assert got == want == [True] * 25 + [False] * 5
    assert threads and set(threads) == {threading.get_ident()}
    assert 3 <= len(threads) <= 4  # 10 + 10 + 5 units, and the refusal's ask


def test_aacquire_waits_on_the_loop_and_asks_the_store_there(redis_url, loop, monkeypatch):
    import threading

    from ratelimits.engine.local_first import LocalFirst

    _, aio = twins(redis_url)
    front = LocalFirst(aio.twin)
    front.aio = aio
    threads = []
    evaluate = AsyncRedisEngine.evaluate

    async def watched(self, limits, now=None):
        threads.append(threading.get_ident())
        return await evaluate(self, limits, now)

    monkeypatch.setattr(AsyncRedisEngine, "evaluate", watched)
    class Clock:  # moved by the waits, never slept on
        at = T0

        def now(self):
            return self.at

        def sleep(self, seconds):
            self.at += seconds

    clock = Clock()
    limit = Limit("c", "gcra", 10, 1, burst=1, name="paced")  # a turn every 0.1 s
    for _ in range(3):
        decision = loop.run_until_complete(front.aacquire([limit], timeout=1, clock=clock))
        assert decision.allowed
    assert clock.at == pytest.approx(T0 + 0.2)  # the second and third waited their turn
    assert threads and set(threads) == {threading.get_ident()}
