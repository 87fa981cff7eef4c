"""The engine on Redis Cluster: a request's limits decided per hash slot, all at once.

Each policy-and-client has its own hash tag, so one request's limits may live on several
primaries. `ClusterEngine` groups them by slot, runs `lua/slot.lua` once per slot (the
calls of one node in one pipeline, the nodes concurrently: `cluster_fanout`), and keeps
all-or-nothing charging across slots with a compensating refund (`lua/refund.lua`) to
the slots that charged when another slot refused. The per-minute counters and the
offenders are tallied in process and flushed at most every second, because a slot's
script may not touch keys of other slots. See "Redis Cluster" in docs/scale-out.md for
what a concurrent observer can see between a charge and its refund.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster

from ratelimits.engine.acquire import Acquiring
from ratelimits.engine.breaker import CircuitBreaker
from ratelimits.engine.cluster_counts import ClusterCounts, cluster_offender_keys
from ratelimits.engine.cluster_fanout import SlotCall, SlotFanout, window_keys
from ratelimits.engine.constants import US
from ratelimits.engine.contract import (
    FIELDS,
    SlotReply,
    assemble,
    decode_lease,
    decode_slot,
    encode,
    encode_lease,
    encode_lease_reset,
    encode_refund,
    encode_release,
    encode_renew,
    note_taken,
    returned_units,
    spare,
    version_args,
)
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.flows import Flow, run_flow
from ratelimits.engine.heartbeat import Heartbeat, live_source
from ratelimits.engine.keynames import (
    base_key,
    clock_of,
    figure_keys,
    new_token,
    stored_state,
    to_us,
)
from ratelimits.engine.lease import Grant, Leftover
from ratelimits.engine.registry import REGISTRY
from ratelimits.engine.scripts import (
    lease_source,
    refund_source,
    release_source,
    renew_source,
    slot_source,
    version_source,
)
from ratelimits.engine.tally import Tally
from ratelimits.engine.transport import guard, guarded
from ratelimits.engine.types import Decision, Limit
from ratelimits.engine.watch import RESET_TTL, ChangeWatch, forget_key, watch_connection

__all__ = ["ClusterEngine"]

T = TypeVar("T")

#: The fan-out's ids of the calls that route by their key: the version GET, the heartbeat.
_VERSION, _LIVE = -1, -2


class ClusterEngine(Acquiring):
    """Same API as `RedisEngine`, on a `redis.cluster.RedisCluster` client. Thread-safe.

    Time: each slot's script reads its own node's clock (`TIME`) unless `evaluate()` is
    given `now` (or the engine `clock="client"`: this process's clock, sent with every
    call); every key lives on one node, so each key's state sees one clock.

    Its calls (a decision, the version, a lease) are flows that yield what the slot
    fan-out needs (`cluster_fanout`): this engine performs it with `perform`, its asyncio
    twin (`engine.aio`) awaits the same flows.
    """

    def __init__(
        self,
        client: redis.cluster.RedisCluster,
        *,
        prefix: str = "rl:",
        version_key: str | None = None,
        stats: bool = True,
        clock: str = "store",
        breaker: CircuitBreaker | None = None,
        live_key: str | None = None,
    ) -> None:
        self.client: Any = client
        self.prefix = prefix
        self.version_key = version_key
        #: the time a call sends, given the caller's `now` (`keynames.clock_of`)
        self.when = clock_of(clock)
        self.stats = stats
        self.breaker = breaker
        #: the slot fan-out over `client`, and what it learnt of the cluster's topology
        self.fanout = SlotFanout(client)
        # redis-py's stubs type register_script for Redis only; RedisCluster has it too
        register: Any = getattr(client, "register_script")  # noqa: B009
        self._slot = register(slot_source())
        self._refund = register(refund_source())
        self._renew = register(renew_source())
        self._release = register(release_source())
        self._live = register(live_source())
        #: With a `live_key`, calls carry a heartbeat now and then (see `engine.heartbeat`):
        #: the live set is one key on one node, its call one more in the fan-out.
        self.heartbeat = Heartbeat(live_key) if live_key else None
        #: counters and offenders: a slot's script may not touch their keys, so they are
        #: tallied in process and sent in bulk
        self.counts = ClusterCounts(client, prefix, self._fanout)
        self.tally = Tally(self.counts.send)

    def perform(self, need: Any) -> Any:
        """Do one thing a flow of this engine needs (see `SlotFanout.perform`), in this
        thread."""
        return self.fanout.perform(need)

    def _fanout(self, calls: dict[int, SlotCall]) -> dict[int, Any]:
        """Each slot's reply to its call, the nodes at once (see `SlotFanout.run`)."""
        return run_flow(self.fanout.run(calls), self.perform)

    # -- deciding ---------------------------------------------------------------------

    def evaluate(self, limits: Sequence[Limit], now: float | None = None) -> Decision:
        """Check every limit and charge them all only if every enforced one admits, across
        slots: a slot that charged is refunded when another slot refused."""
        now = self.when(now)
        if not limits and not self.version_key:
            return Decision(allowed=True, results=())
        return run_flow(self.breaking(self.deciding(limits, now)), self.perform)

    def deciding(self, limits: Sequence[Limit], now: float | None) -> Flow[Decision]:
        """The decision as a flow (run by this engine, awaited by its asyncio twin)."""
        token = ""
        groups: dict[int, list[int]] = {}  # slot -> indexes of its limits
        keyslot = self.client.keyslot
        for i, limit in enumerate(limits):
            groups.setdefault(keyslot(base_key(self.prefix, limit)), []).append(i)
            if not token and REGISTRY[limit.algorithm].stores_members:
                token = new_token()
        calls: dict[int, SlotCall] = {}
        for slot, indexes in groups.items():
            mine = [limits[i] for i in indexes]
            # one token for the whole request: release() names it
            keys, args, _ = encode(mine, prefix=self.prefix, now=now, stats=False,
                                   token=token or None)
            calls[slot] = SlotCall(self._slot, keys, args, window_keys(self.prefix, mine, now))
        # the version rides along where it costs no node more (else the caller reads it
        # now and then: `read_version`)
        rider = (_VERSION, SlotCall(None, [self.version_key], [])) if self.version_key else None
        reached: dict[int, Any] = {}
        try:
            replies = yield from self._beating(calls, now, reached, rider)
        except EngineUnavailable as exc:
            yield from self._refund_reached(limits, groups, reached, token)
            note_taken(limits, token, exc)  # a node that timed out may run it later
            raise
        raw, undo, now_us = self._collect(limits, groups, replies)
        admitted = len(undo) == len(groups)
        if not admitted and undo:
            yield from self.refunding(limits, groups, undo, token, raw)
        version = None
        if _VERSION in replies:
            v = replies[_VERSION]
            version = int(v) if v is not None else 0
        decision = assemble(limits, raw, admitted=admitted, version=version,
                            token=token or None, now_us=now_us)
        if self.stats and now_us is not None:
            self.tally.add(decision, now_us)
        return decision

    @staticmethod
    def _collect(limits: Sequence[Limit], groups: dict[int, list[int]],
                 replies: dict[int, Any]
                 ) -> tuple[list[Any], dict[int, SlotReply], int | None]:
        """The slots' results laid out per limit in the request's order; the replies of
        the slots that charged; the first slot's time (µs)."""
        raw: list[Any] = [None] * (FIELDS * len(limits))
        undo: dict[int, SlotReply] = {}
        now_us: int | None = None
        for slot, indexes in groups.items():
            try:
                reply = decode_slot(replies[slot], len(indexes))
            except ValueError as exc:
                raise EngineError(str(exc)) from exc
            if now_us is None:
                now_us = reply.now_us
            if reply.admitted:
                undo[slot] = reply
            for j, i in enumerate(indexes):
                raw[i * FIELDS:(i + 1) * FIELDS] = reply.results[j * FIELDS:(j + 1) * FIELDS]
        return raw, undo, now_us

    def _refund_reached(self, limits: Sequence[Limit], groups: dict[int, list[int]],
                        replies: dict[int, Any], token: str) -> Flow[None]:
        """A node was out of reach: the request is undecided, so the slots that charged
        on the nodes reached give it back (best effort: the caller fails either way)."""
        undo = {slot: decode_slot(reply, len(groups[slot])) for slot, reply in replies.items()
                if slot in groups and isinstance(reply, list) and reply and reply[0] == 1}
        if not undo:
            return
        raw: list[Any] = [0] * (FIELDS * len(limits))
        with contextlib.suppress(EngineError):  # what stays charged expires by itself
            yield from self.refunding(limits, groups, undo, token, raw)

    def refunding(self, limits: Sequence[Limit], groups: dict[int, list[int]],
                  undo: dict[int, SlotReply], token: str, raw: list[Any]) -> Flow[None]:
        """Give back what the admitting slots (`undo`) charged, at the time they charged;
        their limits' outcomes in `raw` become SPARED, with the units they took counted
        as remaining."""
        calls: dict[int, SlotCall] = {}
        for slot, reply in undo.items():
            charged = [(j, i) for j, i in enumerate(groups[slot]) if reply.charged(j, limits[i])]
            if not charged:
                continue
            keys, args = encode_refund(self.prefix, reply.now_us, token,
                                       [(limits[i], reply.writes[j]) for j, i in charged])
            for _, i in charged:
                spare(raw, i, limits[i].cost)
            mine = [limits[i] for i in groups[slot]]
            calls[slot] = SlotCall(self._refund, keys, args,
                                   window_keys(self.prefix, mine, reply.now_us / US))
        yield from self.fanout.run(calls)

    def breaking(self, flow: Flow[T]) -> Flow[T]:
        """`flow` behind the circuit breaker (`transport.guarded`): it fails fast while
        the breaker is open, and each EngineError (EngineUnavailable included) counts as
        a failure."""
        return guarded(self.breaker, flow)

    # -- the version and the heartbeat ------------------------------------------------

    @property
    def live_instances(self) -> int | None:
        """Processes that beat within the TTL at this one's last beat (None: no beat yet)."""
        return None if self.heartbeat is None else self.heartbeat.count

    def read_version(self, now: float | None = None) -> int:
        """The policy version alone: one GET, with a heartbeat beside it when one is due
        (the nodes at once)."""
        now = self.when(now)
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        raw = run_flow(self.breaking(self.reading_version(now)), self.perform)
        return int(raw) if raw is not None else 0

    def reading_version(self, now: float | None) -> Flow[Any]:
        """The version's GET as a flow (see `deciding`); the raw value."""
        key = self.version_key or ""  # read_version() made sure there is one
        replies = yield from self._beating({_VERSION: SlotCall(None, [key], [])}, now)
        return replies[_VERSION]

    def _beating(self, calls: dict[int, SlotCall], now: float | None,
                 reached: dict[int, Any] | None = None,
                 rider: tuple[int, SlotCall] | None = None) -> Flow[dict[int, Any]]:
        """The fan-out of `calls` (and `rider`, see `SlotFanout.run`), with the heartbeat's
        call among them when one is due."""
        beat = self.heartbeat
        if beat is None or not beat.due():
            return (yield from self.fanout.run(calls, reached, rider))
        calls[_LIVE] = SlotCall(self._live, [beat.key], beat.args(now))
        try:
            replies = yield from self.fanout.run(calls, reached, rider)
        except EngineError:
            beat.missed()
            raise
        beat.learnt(replies.pop(_LIVE))
        return replies

    # -- counters and offenders, tallied in process ------------------------------------

    def count_locally(self, decision: Decision, now_us: int) -> None:
        """Count a decision made without the store's script (see `tally`)."""
        self.tally.add(decision, now_us)

    def count_fields(self, name: str, now_us: int, fields: Mapping[str, int]) -> None:
        """Add figures to policy `name`'s counters of that minute (see `tally`)."""
        self.tally.add_fields(name, now_us, fields)

    def flush(self) -> None:
        """Send the tallied counters and offenders to the cluster now (raises
        EngineUnavailable when it cannot; they stay tallied for the next flush)."""
        self.tally.flush()

    def close(self) -> None:
        """Flush what is tallied and stop the engine's threads (also run at exit)."""
        self.tally.close()

    # -- everything else ----------------------------------------------------------------

    #: The slots of `concurrency` limits expire after their period unless renewed.
    slots_expire = True

    def release(self, decision: Decision) -> None:
        """Free the concurrency slots an admitted decision holds, behind the circuit
        breaker: EngineUnavailable (at once while the circuit is open) says they are
        still held, for the caller to try again."""
        if decision.token is not None:
            run_flow(self.breaking(self.releasing(decision)), self.perform)

    def releasing(self, decision: Decision) -> Flow[None]:
        """`release()` as a flow (run by this engine, awaited by its asyncio twin): one
        call per slot, the nodes at once, a moved slot followed as a decision's is."""
        calls = {slot: SlotCall(self._release, *encode_release(self.prefix, mine))
                 for slot, mine in self._held_by_slot([decision]).items()}
        if calls:
            yield from self.fanout.run(calls)

    def renew(self, decisions: Sequence[Decision], now: float | None = None) -> None:
        """Keep the slots these decisions hold for another `period` from now: one call per
        slot, the nodes at once. Slots already released or expired stay gone."""
        now = self.when(now)
        calls = {slot: SlotCall(self._renew, *encode_renew(self.prefix, mine, now))
                 for slot, mine in self._held_by_slot(decisions).items()}
        if calls:
            self._fanout(calls)

    def _held_by_slot(self, decisions: Sequence[Decision]
                      ) -> dict[int, list[tuple[Limit, list[str]]]]:
        """The slots `decisions` hold, by the hash slot of their limits' keys."""
        held: dict[int, list[tuple[Limit, list[str]]]] = {}
        for decision in decisions:
            for limit, members in decision.holding():
                slot = self.client.keyslot(base_key(self.prefix, limit))
                held.setdefault(slot, []).append((limit, members))
        return held

    def watch(self) -> ChangeWatch | None:
        """A connection of its own to the node that holds the version key (and the reset
        keys, in its slot), hearing them written and that node flushed (see `watch`);
        None without a version key. Asked again after a failover, it finds the new
        primary once the client has learnt the slots anew."""
        if not self.version_key:
            return None
        node = self.client.get_node_from_key(self.version_key)
        pool = self.client.get_redis_connection(node).connection_pool
        return ChangeWatch(watch_connection(pool), self.version_key)

    def announce_reset(self, name: str) -> None:
        """Tell every process's watch that clients of policy `name` were reset."""
        if self.version_key:
            key = forget_key(self.version_key, name)
            guard(lambda: self.client.set(key, 1, ex=RESET_TTL))

    def bump_version(self) -> int:
        """Tell every process that the policies changed; returns the new version."""
        if not self.version_key:
            raise EngineError("this engine was built without a version_key")
        # INCR, from the clock when the key was lost (lua/version.lua)
        args = version_args(self.when(None))
        bump: Any = getattr(self.client, "register_script")(version_source())  # noqa: B009
        return int(guard(lambda: bump(keys=[self.version_key], args=args)))

    def counters(self, name: str, minute: int) -> dict[str, int]:
        """The a/r/w/o counts of one policy in one minute, this process's tally flushed
        first (other processes' arrive within `FLUSH_EVERY`)."""
        return self.counters_many([(name, minute)])[0]

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """`counters()` of many (name, minute) pairs in one pipelined fan-out."""
        self.flush()
        return self.counts.counters_many(wanted)

    def offenders(self, name: str, hour: int, n: int = 10) -> list[tuple[str, int]]:
        """The clients one policy refused most in one hour, by guaranteed count."""
        return self.offenders_many([(name, hour)], n)[0]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """`offenders()` of many (name, hour) pairs in one pipelined fan-out."""
        self.flush()
        return self.counts.offenders_many(wanted, n)

    def forget_figures(self, name: str, now: float | None = None) -> None:
        """Forget every figure of policy `name` (its per-minute counters, its offenders),
        as when the policy is deleted: a policy created again under its name starts from
        zero. This process's tally is sent first; each key is deleted alone, so that the
        cluster routes it to its slot.
        """
        self.flush()
        keys = figure_keys(self.prefix, name, time.time() if now is None else now,
                           cluster_offender_keys)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.delete(key)
        guard(pipe.execute)

    def reset(self, limit: Limit, now: float | None = None) -> None:
        """Forget one client's state under one limit (current and previous windows). A
        leased limit keeps the units other processes' leases may still spend (see
        `lease`)."""
        now = self.when(now)
        if limit.batch is not None:
            keys, args = encode_lease_reset(self.prefix, limit, now)
            script = self._leases()
            guard(lambda: script(keys=keys, args=args))
            return
        key = base_key(self.prefix, limit)

        def now_us() -> int:
            if now is not None:
                return to_us(now)
            node = self.client.get_node_from_key(key)
            seconds, micros = guard(self.client.get_redis_connection(node).time)
            return int(seconds) * US + int(micros)

        keys, cells = stored_state(self.prefix, limit, now_us)

        def delete() -> None:
            pipe = self.client.pipeline()  # one slot: the limit's keys share a hash tag
            for key in keys:
                pipe.delete(key)
            for hash_key, field in cells:
                pipe.hdel(hash_key, field)
            pipe.execute()

        guard(delete)

    # -- leases (see engine/lease.py) -------------------------------------------------

    _lease_script: Any = None  # registered on first use: most sites lease nothing

    # repeats: StoreEngine.lease's signature and RedisEngine's heartbeat count
    def lease(
        self,
        limits: Sequence[Limit],
        now: float | None = None,
        *,
        back: Sequence[Leftover] = (),
    ) -> list[Grant]:
        """Take a lease of `batch` units for each of `limits` after giving back `back`
        (see `RedisEngine.lease`): one call per slot, the nodes at once."""
        now = self.when(now)
        return run_flow(self.leasing(limits, now, back), self.perform)[0]

    def give_back(self, back: Sequence[Leftover], now: float | None = None) -> int:
        """Return the unspent units of ended leases (see `RedisEngine.give_back`)."""
        now = self.when(now)
        return run_flow(self.leasing((), now, back), self.perform)[1] if back else 0

    def _leases(self) -> Any:
        """The lease script, registered on first use."""
        if self._lease_script is None:
            register: Any = getattr(self.client, "register_script")  # noqa: B009
            self._lease_script = register(lease_source())
        return self._lease_script

    def leasing(self, limits: Sequence[Limit], now: float | None, back: Sequence[Leftover]
                ) -> Flow[tuple[list[Grant], int]]:
        """`lease()` as a flow (see `deciding`): the grants, and the units taken back."""
        if not limits and not back:
            return [], 0
        script = self._leases()
        keyslot = self.client.keyslot
        wanted: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (limits, give-backs)
        for i, item in enumerate(back):
            wanted.setdefault(keyslot(base_key(self.prefix, item.limit)), ([], []))[1].append(i)
        for i, limit in enumerate(limits):
            wanted.setdefault(keyslot(base_key(self.prefix, limit)), ([], []))[0].append(i)
        calls: dict[int, SlotCall] = {}
        parts: dict[int, tuple[list[Limit], list[Leftover]]] = {}
        for slot, (mine, theirs) in wanted.items():
            part = parts[slot] = ([limits[i] for i in mine], [back[i] for i in theirs])
            keys, args = encode_lease(self.prefix, *part, now)
            touched = [*part[0], *(b.limit for b in part[1])]
            calls[slot] = SlotCall(script, keys, args,
                                   window_keys(self.prefix, touched, now))
        replies = yield from self.breaking(self.fanout.run(calls))
        grants: list[Grant | None] = [None] * len(limits)
        returned = 0
        try:
            for slot, (mine, _) in wanted.items():
                for i, grant in zip(mine, decode_lease(*parts[slot], replies[slot]),
                                    strict=True):
                    grants[i] = grant
                returned += returned_units(parts[slot][1], replies[slot])
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        return [g for g in grants if g is not None], returned
