"""`MemoryEngine.decide()` (the replay fast path) decides exactly as `evaluate()`."""

from __future__ import annotations

import random

import pytest

from ratelimits.engine import ALGORITHMS, Limit, MemoryEngine
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.types import CHARGE, RESERVE, Outcome
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


def _one_limit(rng: random.Random, client: str) -> Limit:
    """One limit of a random algorithm, shadow or enforced, sometimes with a lockout or a
    reservation (which `take_one` leaves to `take`)."""
    algorithm = rng.choice(ALGORITHMS)
    limit = rng.randint(1, 6)
    spec = REGISTRY[algorithm]
    burst = rng.choice([None, limit + rng.randint(0, 3)]) if spec.has_burst else None
    return Limit(client, algorithm, limit, rng.choice([1.0, 2.5, 10.0]), burst=burst,
                 cost=rng.choice([1, 1, 2]) if limit > 1 else 1,
                 shadow=rng.random() < 0.3, name="p",
                 lockout=rng.choice([0.0, 0.0, 0.0, 3.0]),
                 stage=CHARGE if spec.delays or spec.holds_slots else rng.choice(
                     [CHARGE, CHARGE, RESERVE]))


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_take_one_decides_as_take_of_one_limit(seed, counted):
    """The per-process request's one limit (`take_one`, which assembles its decision
    itself) is decided, charged and counted as `take([limit])` decides it, refusals,
    shadow and delays included."""
    rng = random.Random(seed)
    limits = {c: _one_limit(rng, c) for c in "abcd"}
    batch = MemoryEngine(counted=counted)
    one = MemoryEngine(counted=counted)
    now = T0
    outcomes = set()
    for _ in range(300):
        now += rng.choice([0.0, 0.0, 0.05, 0.3, 1.7])
        limit = limits[rng.choice("abcd")]
        expected, _ = batch.take([limit], now)
        got = one.take_one(limit, now)
        assert got == expected
        assert (got.token is None) == (expected.token is None)
        assert got.reserved_us == expected.reserved_us
        outcomes.add(got.results[0].outcome)
    minute = int(now // 60)
    assert one.counters("p", minute) == batch.counters("p", minute)
    assert Outcome.ADMITTED in outcomes and outcomes & {Outcome.REJECTED, Outcome.WOULD_REJECT}
