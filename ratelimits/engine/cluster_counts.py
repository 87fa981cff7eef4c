"""The per-minute counters and the offenders on a Redis Cluster.

A slot's script may not touch keys of other slots, so a `ClusterEngine` tallies its
counts in process (`tally`) and `ClusterCounts` sends them in bulk (the counters
pipelined and routed by the cluster client, every policy-hour's offenders in one slot
fan-out) and reads them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ratelimits.engine.cluster_fanout import SlotCall
from ratelimits.engine.constants import STATS_TTL
from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.keynames import guaranteed, stats_key
from ratelimits.engine.scripts import offend_source
from ratelimits.engine.tally import Counts
from ratelimits.engine.transport import STORE_ERRORS, guard

__all__ = [
    "ClusterCounts",
    "cluster_offender_errors_key",
    "cluster_offender_keys",
    "cluster_offenders_key",
]


def cluster_offenders_key(prefix: str, name: str, hour: int) -> str:
    """One policy-hour's offenders on a cluster: hash-tagged by the policy, so the list and
    its error hash share a slot and one script updates both."""
    return f"{prefix}s:{{{name}}}:h{hour}"


def cluster_offender_errors_key(prefix: str, name: str, hour: int) -> str:
    return f"{cluster_offenders_key(prefix, name, hour)}:e"


def cluster_offender_keys(prefix: str, name: str, hour: int) -> tuple[str, str]:
    """The offenders of one policy in one hour, and their errors, on a cluster."""
    return (cluster_offenders_key(prefix, name, hour),
            cluster_offender_errors_key(prefix, name, hour))


class ClusterCounts:
    """Counters and offenders under `prefix` on the cluster of `client`; `fanout` runs
    slot calls (`ClusterEngine`'s, the nodes at once). Thread-safe."""

    def __init__(self, client: Any, prefix: str,
                 fanout: Callable[[dict[int, SlotCall]], dict[int, Any]]) -> None:
        self.client = client
        self.prefix = prefix
        self._fanout = fanout
        # redis-py's stubs type register_script for Redis only; RedisCluster has it too
        register: Any = getattr(client, "register_script")  # noqa: B009
        self._offend = register(offend_source())

    def send(self, counts: Counts, offenders: Counts) -> None:
        """Pipelined counters, routed by the cluster client, and every policy-hour's
        offenders in one fan-out: a page that flushes first pays one round trip per node,
        not one per policy (a negative id routes by the key)."""
        try:
            if counts:
                pipe = self.client.pipeline()
                for (name, minute), fields in counts.items():
                    key = stats_key(self.prefix, name, minute)
                    for field, n in fields.items():
                        pipe.hincrby(key, field, n)
                    pipe.expire(key, STATS_TTL)
                pipe.execute()
                counts.clear()  # delivered: a failure below must not send them twice
        except STORE_ERRORS as exc:  # a send that fails waits for the next flush
            raise EngineUnavailable(str(exc) or type(exc).__name__) from exc
        calls: dict[int, SlotCall] = {}
        for i, ((name, hour), whos) in enumerate(offenders.items()):
            args: list[Any] = []
            for who, n in whos.items():
                args += (who.encode("utf-8", "surrogatepass"), n)
            calls[-2 - i] = SlotCall(self._offend,
                                     [cluster_offenders_key(self.prefix, name, hour),
                                      cluster_offender_errors_key(self.prefix, name, hour)],
                                     args)
        if calls:
            try:
                self._fanout(calls)
            except EngineError as exc:
                if isinstance(exc, EngineUnavailable):
                    raise
                raise EngineUnavailable(str(exc)) from exc

    def counters_many(self, wanted: Sequence[tuple[str, int]]) -> list[dict[str, int]]:
        """The a/r/w/o counts of many (name, minute) pairs in one pipelined fan-out."""
        pipe = self.client.pipeline()
        for name, minute in wanted:
            pipe.hgetall(stats_key(self.prefix, name, minute))
        return [{_text(k): int(v) for k, v in raw.items()} for raw in guard(pipe.execute)]

    def offenders_many(
        self, wanted: Sequence[tuple[str, int]], n: int = 10
    ) -> list[list[tuple[str, int]]]:
        """The clients each of many (name, hour) pairs refused most, by guaranteed count,
        in one pipelined fan-out."""
        pipe = self.client.pipeline()
        for name, hour in wanted:
            pipe.zrange(cluster_offenders_key(self.prefix, name, hour), 0, -1, withscores=True)
            pipe.hgetall(cluster_offender_errors_key(self.prefix, name, hour))
        replies = guard(pipe.execute)
        return [
            guaranteed({_text(k): int(v) for k, v in raw},
                       {_text(k): int(v) for k, v in errors.items()}, n)
            for raw, errors in zip(replies[::2], replies[1::2], strict=True)
        ]


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
