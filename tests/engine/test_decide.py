"""`MemoryEngine.decide()` (the replay fast path) decides exactly as `evaluate()`."""

from __future__ import annotations

import random

import pytest

from ratelimits.engine import ALGORITHMS, Limit, MemoryEngine
from ratelimits.engine.registry import REGISTRY
from tests.engine.conftest import T0


def _limits(rng: random.Random, client: str) -> list[Limit]:
    """Two to four limits of random algorithms, shadow or enforced, on one client."""
    out = []
    for i in range(rng.randint(2, 4)):
        algorithm = rng.choice(ALGORITHMS)
        limit = rng.randint(1, 6)
        burst = rng.choice([None, limit + rng.randint(0, 3)])
        if not REGISTRY[algorithm].has_burst:
            burst = None
        out.append(
            Limit(
                client,
                algorithm,
                limit,
                rng.choice([1.0, 2.5, 10.0]),
                burst=burst,
                cost=1,
                shadow=rng.random() < 0.3,
                name=f"p{i}",
            )
        )
    return out


@pytest.mark.parametrize("seed", range(20))
def test_decide_matches_evaluate_on_random_traffic(seed):
    rng = random.Random(seed)
    policies = {c: _limits(rng, c) for c in ("a", "b", "c")}
    slow, fast = MemoryEngine(), MemoryEngine()
    prepared = {c: [fast.prepare(limit) for limit in ls] for c, ls in policies.items()}
    now = T0
    for _ in range(400):
        now += rng.choice([0.0, 0.0, 0.05, 0.3, 1.7])
        client = rng.choice("abc")
        decision = slow.evaluate(policies[client], now=now)
        admitted, allowed = fast.decide(prepared[client], now)
        assert admitted == decision.allowed
        assert allowed == [int(r.allowed) for r in decision.results]


def test_refused_by_an_enforced_limit_charges_none_and_shadow_never_blocks():
    engine = MemoryEngine()
    tight = engine.prepare(Limit("x", "fixed_window", 1, 10, name="tight"))
    loose = engine.prepare(Limit("x", "fixed_window", 5, 10, name="loose"))
    shadow = engine.prepare(Limit("x", "fixed_window", 1, 10, shadow=True, name="shadow"))
    assert engine.decide([tight, loose, shadow], T0) == (True, [1, 1, 1])
    # tight refuses: nothing is charged, so loose still has 4 left after this.
    assert engine.decide([tight, loose], T0) == (False, [0, 1])
    assert engine.decide([loose, shadow], T0) == (True, [1, 0])  # shadow only counts
    for _ in range(3):  # loose was charged twice: three more of its five pass
        assert engine.decide([loose], T0)[0]
    assert engine.decide([loose], T0) == (False, [0])


def test_decide_records_no_counters():
    engine = MemoryEngine()
    engine.decide([engine.prepare(Limit("x", "gcra", 1, 1, name="p"))], T0)
    assert engine.counters("p", int(T0 // 60)) == {}
