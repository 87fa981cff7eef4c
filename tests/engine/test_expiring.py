"""The in-process expiring store forgets idle clients, at a bounded cost per operation."""

from __future__ import annotations

from ratelimits.engine import Limit, MemoryEngine
from ratelimits.engine.expiring import GRAIN, ExpiringStore
from ratelimits.engine.keynames import US
from tests.engine.conftest import T0


def _visit(engine: MemoryEngine, clients: int, start: float, step: float) -> None:
    """`clients` distinct clients, one request each, `step` seconds apart (replay's path)."""
    for i in range(clients):
        limit = Limit(f"client-{start}-{i}", "fixed_window", 5, 10, name="p")
        engine.decide([engine.prepare(limit)], start + i * step)


def test_expired_keys_are_gone_and_the_store_stays_bounded():
    engine = MemoryEngine()
    # 40 new clients per second, each key kept until its 10 s window ends
    for round_ in range(5):
        _visit(engine, 2_000, T0 + round_ * 50, 0.025)
        assert len(engine._store.data) <= 40 * 10 + 1
    # an idle stretch: the next request finds only its own key left
    _visit(engine, 1, T0 + 3600, 1)
    assert list(engine._store.data) == [next(iter(engine._store.data))]
    assert len(engine._store.data) == 1


def test_sweeping_examines_a_bounded_number_of_entries_per_operation():
    """Amortised O(1): no walk over every key, however many clients are live."""
    engine = MemoryEngine()
    _visit(engine, 20_000, T0, 0.001)  # up to 10,000 live keys at any moment
    store = engine._store
    writes = 20_000  # one key written per admitted request
    assert store.examined <= 2 * writes, store.examined


def test_a_key_written_again_lives_until_its_latest_expiry():
    store = ExpiringStore()
    store.set("k", 1, 0.0, 10 * US)
    store.set("k", 2, 5 * US, 10 * US)  # extended to 15 s
    store.sweep(12 * US)
    assert store.get("k", 12 * US) == 2
    assert store.get("k", 15 * US) is None  # reads see the exact expiry


def test_memory_is_freed_at_most_one_slot_after_the_expiry():
    store = ExpiringStore()
    store.set("longer", 1, 0.0, 10 * US)
    store.set("longer", 2, 5 * US, 10 * US)  # extended to 15 s
    store.set("shorter", 1, 0.0, 10 * US)
    store.set("shorter", 2, 1 * US, 2 * US)  # shortened to 3 s
    store.sweep(3 * US + GRAIN)
    assert list(store.data) == ["longer"]
    store.sweep(15 * US - 1)
    assert list(store.data) == ["longer"]
    store.sweep(15 * US + GRAIN)
    assert store.data == {}


def test_a_hot_key_costs_one_entry_however_often_it_is_written():
    store = ExpiringStore()
    for i in range(10_000):
        store.set("hot", i, float(i), 60 * US)
        store.sweep(float(i))
    assert store.filed() == 1
