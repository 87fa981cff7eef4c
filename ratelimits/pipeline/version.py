"""Whether another process changed the policies: the store's policy version, learnt from
the store's replies or read, and the snapshot it calls for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async

from ratelimits import runtime
from ratelimits.engine.errors import EngineError
from ratelimits.pipeline.compiled import Snapshot
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.report import log_unavailable
from ratelimits.pipeline.resolver import resolver
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
) -> Snapshot | None:
    """The snapshot of a policy version newer than `snap`'s, if one was built.

    `version` is what the store's reply carried; None when nothing carried it (no store
    call, or one answered in process), and then it is read, at most once per
    `VERSION_EVERY` per process, by one request at a time (the others go on with the
    snapshot they have).
    """
    if version is None:
        lock = _claim()
        if lock is None:
            return None
        try:
            version = int(get_engine().read_version())
        except EngineError as exc:
            return _failed(exc, config)
        finally:
            _read(lock)
    return resolver.observe(version, snap) if resolver.outdates(version, snap) else None


async def anewer_snapshot(
    version: int | None, snap: Snapshot, config: Mapping[str, Any]
) -> Snapshot | None:
    """`newer_snapshot` on the event loop: the version awaited, the snapshot built in a
    thread (it reads the database)."""
    if version is None:
        lock = _claim()
        if lock is None:
            return None
        try:
            version = int(await get_engine().aread_version())
        except EngineError as exc:
            return _failed(exc, config)
        finally:
            _read(lock)
    if not resolver.outdates(version, snap):
        return None
    return await sync_to_async(resolver.observe)(version, snap)


def _claim() -> Any:
    """The version lock, when the version is due to be read and no other request reads
    it; else None."""
    if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        return None
    lock = process.version_lock
    if not lock.acquire(blocking=False):
        return None
    if runtime.clock().monotonic() - process.version_at < VERSION_EVERY:
        lock.release()  # read by another thread meanwhile
        return None
    return lock


def _failed(exc: EngineError, config: Mapping[str, Any]) -> Snapshot | None:
    """No version read: no newer snapshot (tried again a second later, see `_read`)."""
    log_unavailable(exc, config)
    return None


def _read(lock: Any) -> None:
    """The version was read (or failed to be: again a second later)."""
    process.version_at = runtime.clock().monotonic()
    lock.release()
