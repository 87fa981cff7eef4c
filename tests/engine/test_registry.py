"""Every algorithm is one registry entry, and everything the engine lists derives from it."""

from __future__ import annotations

import re
from dataclasses import replace
from importlib import resources

import pytest

from ratelimits.engine import ALGORITHMS, Limit, MemoryEngine, RedisEngine, scripts
from ratelimits.engine.keynames import base_key
from ratelimits.engine.registry import LEARNED_ALGORITHMS, REGISTRY
from ratelimits.engine.scripts import batch_source
from tests.engine.conftest import T0


def test_names_and_key_codes_are_unique():
    assert tuple(REGISTRY) == ALGORITHMS + LEARNED_ALGORITHMS
    codes = [spec.code for spec in REGISTRY.values()]
    assert len(set(codes)) == len(codes)
    assert all(re.fullmatch(r"[a-z]{1,2}", code) for code in codes)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_entry_has_its_lua_bodies_and_its_functions_in_the_script(name):
    text = (resources.files("ratelimits.engine") / "lua" / REGISTRY[name].lua).read_text()
    assert text.index("--[[check]]") < text.index("--[[commit]]")
    assert batch_source().count(f"algorithm == '{name}' then") == 1  # its check and commit


@pytest.mark.parametrize("name", ALGORITHMS)
def test_burst_is_accepted_exactly_where_the_entry_says(name):
    spec = REGISTRY[name]
    if spec.has_burst:
        assert Limit("k", name, 4, 60, burst=6).capacity == 6
        default = Limit("k", name, 4, 60)
        assert spec.burst_of(default) == (0 if spec.delays else 4)
        assert default.capacity == 4  # a queue of 0 still lets one through: the limit
    else:
        with pytest.raises(ValueError, match="burst applies only to"):
            Limit("k", name, 4, 60, burst=6)


def test_the_memory_engine_runs_the_entry_functions():
    engine = MemoryEngine()
    for name, spec in REGISTRY.items():
        prepared = engine.prepare(Limit("k", name, 4, 60))
        assert (prepared.check, prepared.commit) == (spec.check, spec.commit)
        assert prepared.needs_token is spec.holds_slots


@pytest.mark.parametrize("name", LEARNED_ALGORITHMS)
def test_a_store_engine_refuses_a_learned_limit_with_a_message(redis_client, name):
    """A learned limit belongs to the process's `AdaptiveEngine`: a store engine handed
    one says so, rather than deciding it by a rule it does not have."""
    limit = Limit("k", name, 4, 60, name="p")
    assert name not in batch_source()
    for engine in (RedisEngine(redis_client), MemoryEngine()):
        with pytest.raises(ValueError, match="learnt in each process"):
            engine.evaluate([limit], now=T0)


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if s.windowed])
def test_reset_clears_a_windowed_limit_on_both_engines(engine, name):
    """Windowed state lives under <key>:<window>: reset() must reach it, at any time."""
    limit = Limit("c", name, 1, 60, name="p")
    at = T0 + 59  # late in the window: the next one has not started
    assert engine.evaluate([limit], now=at).allowed
    assert not engine.evaluate([limit], now=at).allowed
    engine.reset(limit, now=at)
    assert engine.evaluate([limit], now=at).allowed
    assert not engine.evaluate([limit], now=at).allowed


def test_a_new_entry_is_all_an_algorithm_needs(redis_client, monkeypatch):
    """Register a twin of gcra under a new name and code: with nothing else changed, both
    engines validate, key, dispatch and decide it (the script is rebuilt from the
    registry), exactly as they do gcra."""
    monkeypatch.setitem(REGISTRY, "twin", replace(REGISTRY["gcra"], name="twin", code="tw"))
    scripts.batch_source.cache_clear()
    scripts.batch_library.cache_clear()
    try:
        engines = [RedisEngine(redis_client), MemoryEngine()]
        twin, gcra = Limit("c", "twin", 3, 60, burst=2), Limit("c", "gcra", 3, 60, burst=2)
        assert base_key("rl:", twin).endswith(":tw")
        for engine in engines:
            got = [engine.evaluate([twin], now=T0 + t) for t in (0, 0, 0, 20, 20)]
            want = [engine.evaluate([gcra], now=T0 + t) for t in (0, 0, 0, 20, 20)]
            assert [d.allowed for d in got] == [True, True, False, True, False]
            assert [(d.allowed, d.retry_after) for d in got] == [
                (d.allowed, d.retry_after) for d in want
            ]
    finally:
        scripts.batch_source.cache_clear()
        scripts.batch_library.cache_clear()
