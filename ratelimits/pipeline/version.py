"""Whether another process changed the policies: the store's policy version, learnt from
the store's replies or read, and the snapshot it calls for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ratelimits import runtime
from ratelimits.engine.errors import EngineError
from ratelimits.pipeline.drivers import Blocking, Steps, VersionRead
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.report import log_unavailable
from ratelimits.pipeline.resolver import Snapshot, resolver
from ratelimits.pipeline.state import process

#: A process that learns the policy version from no reply reads it at most this often.
VERSION_EVERY = 1.0


def current(version: int | None, snap: Snapshot) -> bool:
    """Whether the `version` a store reply carried says `snap` is current (noting when
    it was learnt); False when the reply carried none: `newer_snapshot` finds out."""
    if version is None:
        return False
    process.version_at = runtime.clock().monotonic()
    return not resolver.outdates(version, snap)


def newer_snapshot(
    version: int | None, snap: Snapshot, config: Mapping[str, Any]
) -> Steps:
    """The snapshot of a policy version newer than `snap`'s, if one was built.

    `version` is what the store's reply carried; None when nothing carried it (no store
    call, or one answered in process), and then it is read, at most once per
    `VERSION_EVERY` per process.
    """
    if version is not None:
        if current(version, snap):
            return None  # the snapshot is current: nothing to read
    elif runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        return None
    else:
        version = yield from _read_version(config)
        if version is None or not resolver.outdates(version, snap):
            return None
    return (yield Blocking(resolver.observe, version, snap))


def _read_version(config: Mapping[str, Any]) -> Steps:
    """The version read from the store, when the last one learnt is `VERSION_EVERY`
    old; None when it is younger, another request is reading it, or the store failed.
    One request reads at a time (awaited on the event loop under ASGI): the others go
    on with the snapshot they have."""
    if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        return None
    lock = process.version_lock
    if not lock.acquire(blocking=False):
        return None
    try:
        if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
            return None  # read by another thread meanwhile
        try:
            return int((yield VersionRead(get_engine())))
        except EngineError as exc:
            log_unavailable(exc, config)
            return None
        finally:
            process.version_at = runtime.clock().monotonic()  # failed too: again a second later
    finally:
        lock.release()
