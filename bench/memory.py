"""Section 4: Redis memory per idle client, and every key gone after its TTL.

    .venv/bin/python bench/memory.py [--quick]

Bytes per client: `INFO memory` used_memory after writing the state of N clients (one
admitted request each) minus before, divided by N. Ours is written with pipelined
EVALSHA of the real batch script (per-minute counters off: they are per policy, not per
client). `limits`: one `hit` per client (8 threads). DRF: the history list DRF stores,
written through the same django-redis cache (`cache.set_many`), at several lengths.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench import peers as adapters
from bench.common import Check, Section, table
from ratelimits.engine.constants import WINDOW_SHARDS

BATCH = 1_000


def _used(client) -> int:
    return int(client.info("memory")["used_memory"])


def _settle(client) -> int:
    time.sleep(0.2)
    return _used(client)


def _ours_write(client, algorithm: str, clients: int, period: float, tag: str) -> None:
    """Pipelined decisions of the batch script, exactly the arguments RedisEngine sends."""
    from ratelimits.engine import Limit
    from ratelimits.engine.contract import encode
    from ratelimits.engine.scripts import batch_source

    script = client.register_script(batch_source())
    warm = Limit("warm", "gcra", 1, 0.001)
    keys, args, _ = encode([warm], prefix="rl:", stats=False)
    script(keys=keys, args=args)
    client.delete(*keys)
    pipe = client.pipeline(transaction=False)
    for i in range(clients):
        limit = Limit(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", algorithm, 100, period,
                      name=tag)
        keys, args, _ = encode([limit], prefix="rl:", stats=False)
        script(keys=keys, args=args, client=pipe)
        if i % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()


def _ours(clients: int) -> list[list[str]]:
    from ratelimits.engine import ALGORITHMS

    client = common.redis_client(common.OURS_DB)
    rows = []
    for algorithm in ALGORITHMS:
        common.flush(common.OURS_DB)
        before = _settle(client)
        _ours_write(client, algorithm, clients, 3600, f"mem-{algorithm}")
        after = _settle(client)
        keys = client.dbsize()
        sample = client.randomkey()
        ttl = client.pttl(sample) / 1000
        rows.append([f"ratelimits `{algorithm}`", f"{(after - before) / clients:,.0f}",
                     f"{keys / clients:g}", f"{ttl:,.0f} s", client.type(sample).decode()])
    common.flush(common.OURS_DB)
    return rows


def _floor(clients: int) -> list[list[str]]:
    """The least Redis itself needs: one key of our key length holding one small integer."""
    client = common.redis_client(common.OURS_DB)
    rows = []
    for label, ttl in (("with a TTL", 3_600_000), ("without a TTL", None)):
        common.flush(common.OURS_DB)
        before = _settle(client)
        pipe = client.pipeline(transaction=False)
        for i in range(clients):
            key = f"rl:{{{i:016x}}}:g"  # the length of our keys: 16-character hash tag
            pipe.set(key, 1_800_000_000_000_000 + i, px=ttl)
            if i % BATCH == BATCH - 1:
                pipe.execute()
        pipe.execute()
        after = _settle(client)
        rows.append([f"Redis floor: `SET` of an integer, {label}",
                     f"{(after - before) / clients:,.0f}", "1",
                     "3,600 s" if ttl else "none", "string"])
    common.flush(common.OURS_DB)
    return rows


def _limits(clients: int) -> list[list[str]]:
    from limits import parse

    client = common.redis_client(common.PEERS_DB)
    rows = []
    item = parse("100/hour")
    for strategy in adapters.LIMITS_STRATEGIES:
        common.flush(common.PEERS_DB)
        limiter = adapters.limits_strategy(strategy)
        limiter.hit(item, "warm", "up")
        common.flush(common.PEERS_DB)
        before = _settle(client)

        def chunk(start: int, limiter=limiter) -> None:
            for i in range(start, min(start + BATCH, clients)):
                limiter.hit(item, "mem", f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(chunk, range(0, clients, BATCH)))
        after = _settle(client)
        keys = client.dbsize()
        sample = client.randomkey()
        rows.append([f"limits {strategy.replace('RateLimiter', '')}",
                     f"{(after - before) / clients:,.0f}", f"{keys / clients:g}",
                     f"{client.pttl(sample) / 1000:,.0f} s", client.type(sample).decode()])
    common.flush(common.PEERS_DB)
    return rows


def _drf(clients: int, lengths: tuple[int, ...]) -> tuple[list[list[str]], dict[int, float]]:
    from django.core.cache import cache

    _allow, throttle = adapters.drf_throttle("10/min", scope="anon")
    t = throttle()
    client = common.redis_client(common.PEERS_DB)
    per_key: dict[int, float] = {}
    rows = []
    now = time.time()
    for length in lengths:
        common.flush(common.PEERS_DB)
        cache.set("warm", [1.0], 60)
        common.flush(common.PEERS_DB)
        before = _settle(client)
        history = [now - k * 0.5 for k in range(length)]
        for start in range(0, clients, BATCH):
            batch = {
                t.cache_format % {"scope": t.scope,
                                  "ident": f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"}: history
                for i in range(start, min(start + BATCH, clients))
            }
            cache.set_many(batch, t.duration)
        after = _settle(client)
        per_key[length] = (after - before) / clients
        sample = client.randomkey()
        rows.append([f"DRF SimpleRateThrottle, history of {length}", f"{per_key[length]:,.0f}",
                     f"{client.dbsize() / clients:g}", f"{client.pttl(sample) / 1000:,.0f} s",
                     client.type(sample).decode()])
    common.flush(common.PEERS_DB)
    return rows, per_key


def _expiry(clients: int) -> tuple[str, int, int]:
    """Every algorithm's keys with 1 s limits; DBSIZE right after and 2.5 s later."""
    from ratelimits.engine import ALGORITHMS

    client = common.redis_client(common.OURS_DB)
    common.flush(common.OURS_DB)
    for algorithm in ALGORITHMS:
        _ours_write(client, algorithm, clients, 1, f"ttl-{algorithm}")
    written = client.dbsize()
    time.sleep(2.5)
    left = client.dbsize()
    text = (
        f"Expiry: {clients:,} clients under each of the {len(ALGORITHMS)} algorithms with "
        f"1-second limits (concurrency: slots held, never released) left {written:,} keys; "
        f"2.5 s later `DBSIZE` = **{left}**."
    )
    common.flush(common.OURS_DB)
    return text, written, left


def run(quick: bool = False) -> Section:
    adapters.configure_django()
    clients = 20_000 if quick else 100_000  # the window shards fill from about 4,000
    section = Section("4. Redis memory per idle client")
    ours = _ours(clients)
    floor = _floor(clients)
    peers = _limits(clients)
    lengths = (1, 50, 500)
    drf_clients = clients // 10
    drf_rows, drf_per_key = _drf(drf_clients, lengths)
    drf5_rows, _ = _drf(clients, (5,))
    section.add(
        f"{clients:,} clients, one admitted request each (DRF: {clients:,} clients with 5 "
        f"history entries, and {drf_clients:,} clients at each of several history lengths). "
        "Limits 100 per hour (DRF: 10 per minute). *bytes/key* is the `used_memory` "
        "growth per client, keys and per-key overhead included; *TTL* of a random key."
    )
    slope = (drf_per_key[500] - drf_per_key[50]) / 450
    section.add(table(["state", "bytes per client", "keys per client", "TTL", "type"],
                      ours + floor + peers + drf5_rows + drf_rows))
    section.add(
        f"DRF's history grows with the rate: each admitted request in the window adds one "
        f"pickled float to the client's list, about {slope:.0f} bytes per entry (from "
        f"{drf_per_key[50]:,.0f} B at 50 entries to {drf_per_key[500]:,.0f} B at 500), so a "
        "client at 1,000/min costs about as much as "
        f"{(drf_per_key[50] + slope * 950) / max(1, float(ours[0][1].replace(',', ''))):.0f} "
        "of our fixed-window clients, and every request reads and rewrites the whole list."
    )
    expiry, _written, left = _expiry(1_000 if quick else 10_000)
    section.add(expiry + " Per-policy counters (one hash per policy per minute, not per "
                "client) are kept 25 hours by design and were off here.")
    section.add(
        "The floor rows are Redis's own cost of one key of our length holding a single "
        "integer: its dictionary entry, key string and value object, plus one entry in the "
        "expires dictionary when it has a TTL. Every peer pays it per client. The window "
        f"algorithms do not: a policy's clients are fields of {WINDOW_SHARDS:,} hashes per "
        "window (the shard is a hash of the client), which expire with the window, so the "
        "key's cost is shared by the shard's clients and each client costs its field (an "
        "11-byte name and a small integer in a listpack, the compact encoding Redis keeps "
        "up to `hash-max-listpack-entries` fields, 128 by default). The packing pays from "
        f"about {WINDOW_SHARDS:,} clients per policy and window (fewer leave about one "
        f"client per hash) to about {WINDOW_SHARDS * 100:,} (more spill shards past 128 "
        "fields into Redis's ordinary hash table, about 70 B a field). gcra and the leaky "
        "bucket stay at the floor: each client's state is one number that expires at its "
        "own time, and Redis 7.0 cannot expire a hash field alone (7.4's HEXPIRE can, at "
        "a cost per field that leaves little to gain). The token bucket's hash holds two "
        "numbers (tokens, time); the log and concurrency keep a member per unit."
    )
    per = {row[0]: float(row[1].replace(",", "")) for row in ours}
    for algorithm in ("fixed_window", "sliding_window"):
        value = per[f"ratelimits `{algorithm}`"]
        section.checks.append(Check(f"`{algorithm}` bytes per idle client", value, "≤ 50 B",
                                    value <= 50, unit=" B"))
    gcra = per["ratelimits `gcra`"]
    key_floor = float(floor[0][1].replace(",", ""))
    # at the floor: its value is a time (a double) where the floor row holds an integer
    section.checks.append(Check("`gcra` bytes per idle client vs a key with a TTL",
                                gcra / key_floor, "≤ 1.05×", gcra <= 1.05 * key_floor))
    section.checks.append(Check("keys left 2.5 s after 1 s limits (DBSIZE)", left, "0",
                                left == 0, unit=""))
    return section


if __name__ == "__main__":
    common.run_section(run)
