"""The compiled policy snapshot: which policies apply to a request, without the database.

The snapshot is an immutable value, built from the `Policy` table and swapped in one
assignment. It is rebuilt when this process saved a policy, when its listener hears that
another process did (`changes`: within tens of milliseconds), or when the engine reports
a policy version other than the one it was built at (the fallback where nothing is heard:
a reply, or a read at most once per `VERSION_EVERY`). A rebuild that fails keeps the last
good snapshot and logs why.

The version lives in the store, so an edit saved while the store was down, or on a store
that is not shared (the in-process engine), moves no version other processes see. So each
process also reads a fingerprint of the policy tables (one aggregate query) at most every
`DB_CHECK_EVERY` seconds, and rebuilds when it differs from its snapshot's. On the
in-process engine that is the only way a process learns of a policy saved by another
(another worker, `manage.py shell`, a command), so the interval is what such a save
waits for at most.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.signals import setting_changed
from django.db.models import Count, Max, Subquery, Value
from django.dispatch import receiver

from ratelimits import runtime
from ratelimits.engine.errors import EngineError
from ratelimits.pipeline.changes import listener
from ratelimits.pipeline.compiled import Fingerprint, Snapshot, compile_policy, policy_order
from ratelimits.pipeline.declared import numbered, registry
from ratelimits.pipeline.engines import get_engine
from ratelimits.pipeline.report import log_unavailable
from ratelimits.pipeline.state import process
from ratelimits.rates import parse_rate

logger = logging.getLogger("ratelimits")

#: After a failed rebuild, wait this long before querying the database again.
RETRY_AFTER_FAILURE = 1.0
#: A request that notices a new version while another thread rebuilds waits this long for
#: the new snapshot, then goes on with the last one: a slow database holds no one for long.
WAIT_FOR_RELOAD = 0.25
#: Each process reads the policy tables' fingerprint at most this often (seconds): the
#: longest a policy saved by another process waits on the in-process engine (and on Redis
#: when it was saved while the store was out of reach). One small aggregate query per
#: process per interval, and only while requests arrive: never one per request. Longer
#: than `VERSION_EVERY`: on Redis the version, one GET, tells first.
DB_CHECK_EVERY = 2.0

def table_fingerprint() -> Fingerprint:
    """Per table a snapshot is built from (policies, overrides): its row count and its
    latest `updated`, in one query. Any save moves the latter, a delete the former; an
    `update()` that skips `updated` moves neither, as it sends no signal either."""
    # Not at the top: the pytest plugin (through `ratelimits.testing`) and the middleware
    # import this module before the app registry is ready.
    from ratelimits.models import Override, Policy

    def whole(aggregate: Any) -> Any:  # the override table's figure, as a scalar subquery
        rows = Override.objects.order_by().annotate(all=Value(1)).values("all")
        return Max(Subquery(rows.annotate(x=aggregate).values("x")))

    row = Policy.objects.aggregate(n=Count("pk"), latest=Max("updated"),
                                   on=whole(Count("pk")), olatest=whole(Max("updated")))
    # no policy, no override (they go with their policy): the subqueries then give None
    return ((row["n"], row["latest"]), (row["on"] or 0, row["olatest"]))


def _fingerprint_of(*tables: list[Any]) -> Fingerprint:
    """`table_fingerprint()` of the rows a snapshot was built from (every row, off too)."""
    return tuple((len(rows), max((r.updated for r in rows), default=None)) for rows in tables)

def load_snapshot(version: int | None) -> Snapshot:
    """Read the enabled policies from the database and compile them."""
    from ratelimits.models import Mode, Override, Policy  # not at the top: see table_fingerprint

    rows = list(Policy.objects.all())  # the off ones too: they count in the fingerprint
    overrides = list(Override.objects.order_by())  # no ordering: no join
    by_policy: dict[int, list[Any]] = {}
    for override in overrides:
        by_policy.setdefault(override.policy_id, []).append(override)
    declarations = registry.generation  # before the rows: a later declaration rebuilds
    rows += registry.write(rows)  # the code's declarations not in the table yet, or changed
    compiled = []
    for policy in numbered(registry.compile_rows(rows)):
        if policy.mode == Mode.OFF:
            continue
        try:
            compiled.append(compile_policy(policy, by_policy.get(policy.pk, ())))
        except (ValueError, TypeError) as exc:
            logger.error("ratelimits: policy %r is invalid and is skipped: %s", policy.name, exc)
    groups = {g for c in compiled if c.overrides for g in c.overrides.groups}
    return Snapshot(version=version, policies=tuple(sorted(compiled, key=policy_order)),
                    fingerprint=_fingerprint_of(rows, overrides), members=_members(groups),
                    declarations=declarations)


def pinned_snapshot(policies: Iterable[Mapping[str, Any] | Any]) -> Snapshot:
    """A snapshot of policies given in code (`ratelimits.testing`), never read from the
    database: dicts of `Policy` fields (`rate` may stand for limit and period, `mode` is
    "enforce" unless given) or unsaved `Policy` objects, validated as the admin does;
    with the limits declared in code, as their code gives them."""
    from ratelimits.models import Mode, Policy  # not at the top: see table_fingerprint

    policies = tuple(policies)
    declarations = registry.generation
    rows = []
    for given in policies:
        if isinstance(given, Policy):
            policy = given
        else:
            fields = {"mode": Mode.ENFORCE, "path": "*", **given}
            rate = fields.pop("rate", None)
            if rate is not None:
                fields["limit"], fields["period"] = parse_rate(rate)
            policy = Policy(**fields)
        policy.full_clean(validate_unique=False)
        rows.append(policy)
    compiled = [compile_policy(policy) for policy in numbered(registry.compile_rows(rows))
                if policy.mode != Mode.OFF]
    return Snapshot(version=None, policies=tuple(sorted(compiled, key=policy_order)),
                    declarations=declarations, given=policies)


def _members(groups: set[str]) -> dict[str, frozenset[str]]:
    """For the groups that overrides name: each member's pk -> its groups among them."""
    if not groups:
        return {}
    through = get_user_model().groups.through
    found: dict[str, set[str]] = {}
    for pk, name in through.objects.filter(group__name__in=groups).values_list(
        f"{get_user_model()._meta.model_name}_id", "group__name"
    ):
        found.setdefault(str(pk), set()).add(name)
    return {pk: frozenset(names) for pk, names in found.items()}


class Resolver:
    """Holds the current snapshot and rebuilds it at most once at a time.

    Requests that notice a new version while a rebuild runs wait for it (briefly), so the
    new policies apply to them too.
    """

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._stale_version: int | None = None
        self._stale = False
        self._lock = threading.Lock()
        self._retry_at = 0.0
        #: A snapshot installed by `ratelimits.testing`: the database is not read.
        self.pinned: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        """The current snapshot; built on first use, or now if this process saved a policy
        or imported a module that declares limits in code."""
        if self.pinned is not None:
            return self._current_pin(self.pinned)
        snap = self._snapshot
        if snap is None or self._stale:
            snap = self._rebuild(self._stale_version if self._stale else None, wait=snap is None)
        elif snap.declarations != registry.generation:
            # a new declaration must apply from its first request: wait for the rebuild
            snap = self._rebuild(snap.version, wait=True)
        return snap

    def forget_routes(self) -> None:
        """Every snapshot held works its routes out again (a setting they read changed)."""
        for snap in (self.pinned, self._snapshot):
            if snap is not None:
                snap.routes.clear()

    def ready(self) -> Snapshot | None:
        """The current snapshot when `snapshot()` would not read the database; else None."""
        pinned = self.pinned
        if pinned is not None:
            return pinned if pinned.declarations == registry.generation else None
        snap = self._snapshot
        if snap is None or self._stale or snap.declarations != registry.generation:
            return None
        return snap

    def _current_pin(self, pinned: Snapshot) -> Snapshot:
        """A test's pinned snapshot, compiled again when code declared limits since."""
        if pinned.declarations == registry.generation:
            return pinned
        new = load_snapshot(None) if pinned.given is None else pinned_snapshot(pinned.given)
        self.pinned = new
        return new

    def outdates(self, version: int | None, snap: Snapshot) -> bool:
        """Whether the engine's `version` asks for a snapshot other than `snap`."""
        return version is not None and version != snap.version and self.pinned is None

    def observe(self, version: int | None, snap: Snapshot) -> Snapshot | None:
        """The engine reported `version`; returns a new snapshot if one was built for it."""
        if not self.outdates(version, snap):
            return None
        new = self._rebuild(version, wait=False)
        return new if new is not snap and new.version == version else None

    def recheck(self, snap: Snapshot) -> Snapshot:
        """`snap`, or a new snapshot when the policy tables changed since it was read.
        Reads them at most once per `DB_CHECK_EVERY` per process, in one thread at a time
        (the others go on with `snap`); a failed read is logged and tried again later."""
        if self.pinned is not None:
            return self.pinned
        lock = process.db_check_lock
        if not lock.acquire(blocking=False):
            return snap
        try:
            if runtime.clock().monotonic() - process.db_checked_at < DB_CHECK_EVERY:
                return snap  # read by another thread meanwhile
            process.db_checked_at = runtime.clock().monotonic()
            try:
                seen = table_fingerprint()
            except Exception as exc:  # the database is down ...: the snapshot stays
                logger.warning("ratelimits: could not check the policies for changes "
                               "(%s: %s)", type(exc).__name__, exc)
                return snap
            if seen == snap.fingerprint:
                return snap
            self.invalidate(snap.version)  # the store's version did not move: keep it
        finally:
            lock.release()
        return self.snapshot()

    def invalidate(self, version: int | None) -> None:
        """This process changed policies: rebuild before the next request."""
        self._stale_version = version
        self._stale = True
        self._retry_at = 0.0

    def heard(self, version: int | None) -> None:
        """The listener heard the policies change (`changes`), the store now at `version`
        (None: unknown): rebuild before the next request, unless built at it already."""
        snap = self._snapshot
        if version is None or snap is None or snap.version != version:
            self._stale_version = version  # a failed rebuild still waits to be retried
            self._stale = True

    def forked(self) -> None:
        """In a process just forked: a lock another thread held stays held in the child,
        so new ones; the snapshot is built again at the first request, which starts this
        process's listener (the parent's thread did not come along)."""
        self._lock = threading.Lock()
        snap = self._snapshot
        if snap is not None:
            self.invalidate(snap.version)

    def reset(self) -> None:
        with self._lock:
            self.pinned = None
            self._snapshot = None
            self._stale = False
            self._stale_version = None
            self._retry_at = 0.0

    def _rebuild(self, version: int | None, *, wait: bool) -> Snapshot:
        current = self._snapshot
        if current is not None and runtime.clock().monotonic() < self._retry_at:
            return current
        if not self._lock.acquire(timeout=-1 if wait else WAIT_FOR_RELOAD):
            return current if current is not None else Snapshot(version=None)
        try:
            if self._snapshot is not current:  # another thread rebuilt meanwhile
                return self._snapshot  # type: ignore[return-value]
            if current is not None and runtime.clock().monotonic() < self._retry_at:
                return current  # ... and failed: retry later, not once per waiting thread
            try:
                self._stale = False
                new = load_snapshot(version)
                process.db_checked_at = runtime.clock().monotonic()  # the tables were just read
            except Exception as exc:  # the database is down, a migration is missing ...
                self._retry_at = runtime.clock().monotonic() + RETRY_AFTER_FAILURE
                logger.error(
                    "ratelimits: could not load the policies (%s: %s); keeping the %s",
                    type(exc).__name__,
                    exc,
                    "previous ones" if current is not None else "empty set for now",
                )
                if current is None:
                    current = self._snapshot = Snapshot(version=None)
                return current
            self._snapshot = new
            listener.ensure()  # the first snapshot of this process: changes are pushed
            return new
        finally:
            self._lock.release()


resolver = Resolver()
runtime.on_reset(resolver.reset)
listener.on_policies = resolver.heard
os.register_at_fork(after_in_child=resolver.forked)


@receiver(setting_changed, dispatch_uid="ratelimits.resolver.settings")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "RATELIMITS":
        resolver.invalidate(None)  # compiled with the old settings (MAX_DELAY)


# -- whether another process changed the policies --------------------------------------
#
# The store's policy version, learnt from the store's replies or read, and the snapshot
# it calls for.

#: A process that learns the policy version from no reply reads it at most this often:
#: the bound on how late a change arrives where the listener hears nothing (`changes`).
VERSION_EVERY = 1.0


def current(version: int | None, snap: Snapshot) -> bool:
    """Whether the `version` a store reply carried says `snap` is current (noting when
    it was learnt); False when the reply carried none: `newer_snapshot` finds out."""
    if version is None:
        return False
    process.version_at = runtime.clock().monotonic()
    return not resolver.outdates(version, snap)


def newer_snapshot(
    version: int | None, snap: Snapshot, config: Mapping[str, Any],
    monotonic: float | None = None,
) -> Snapshot | None:
    """The snapshot of a policy version newer than `snap`'s, if one was built.

    `version` is what the store's reply carried; None when nothing carried it (no store
    call, or one answered in process), and then it is read, at most once per
    `VERSION_EVERY` per process, by one request at a time (the others go on with the
    snapshot they have). `monotonic`: the clock's reading the request began at, if the
    caller has it (else read).
    """
    if version is None:
        # most requests find it read less than a second ago: no lock to claim
        if monotonic is None:
            monotonic = runtime.clock().monotonic()
        if monotonic - process.version_at < VERSION_EVERY:
            return None
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
