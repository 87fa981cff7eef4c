"""The compiled policy snapshot: which policies apply to a request, without the database.

The snapshot is an immutable value, built from the `Policy` table and swapped in one
assignment. It is rebuilt when the engine reports a policy version other than the one it
was built at (another process saved a policy), or when this process saved one. A rebuild
that fails keeps the last good snapshot and logs why.

The version lives in the store, so an edit saved while the store was down, or on a store
that is not shared (the in-process engine), moves no version other processes see. So each
process also reads a fingerprint of the policy tables (one aggregate query) at most every
`DB_CHECK_EVERY` seconds, and rebuilds when it differs from its snapshot's. On the
in-process engine that is the only way a process learns of a policy saved by another
(another worker, `manage.py shell`, a command), so the interval is what such a save
waits for at most.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.signals import setting_changed
from django.db.models import Count, Max, Subquery, Value
from django.dispatch import receiver
from django.utils.crypto import salted_hmac

from ratelimits import runtime
from ratelimits.conf import get_config
from ratelimits.engine.registry import LEARNED_ALGORITHMS, REGISTRY
from ratelimits.engine.types import Limit
from ratelimits.matching.keykinds import parse_key
from ratelimits.matching.overrides import OverrideTable, Rule, parse_match
from ratelimits.matching.paths import PathPattern
from ratelimits.matching.responses import (
    CHARGE_WORD,
    RESET_WORD,
    ResponseRule,
    parse_responses,
)
from ratelimits.pipeline.declared import numbered, registry
from ratelimits.pipeline.state import process
from ratelimits.rates import parse_rate

logger = logging.getLogger("ratelimits")

_TEMPLATE_FIELDS = tuple(f.name for f in dataclasses.fields(Limit) if f.name != "key")
#: What an override's limit changes in a client's limit.
_OVERRIDDEN = ("limit", "burst", "batch")
_new_limit = object.__new__
_set = object.__setattr__
#: Each field's slot, written directly: a client's limit is built per policy per request
#: on a cold client, and `object.__setattr__` looks the slot up by name every time.
_SET_KEY = vars(Limit)["key"].__set__
_SET_TEMPLATE = tuple(vars(Limit)[name].__set__ for name in _TEMPLATE_FIELDS)

#: After a failed rebuild, wait this long before querying the database again.
RETRY_AFTER_FAILURE = 1.0
#: A request that notices a new version while another thread rebuilds waits this long for
#: the new snapshot, then goes on with the last one: a slow database holds no one for long.
WAIT_FOR_RELOAD = 0.25
#: Each process reads the policy tables' fingerprint at most this often (seconds): the
#: longest a policy saved by another process waits on the in-process engine (and on Redis
#: when it was saved while the store was out of reach). One small aggregate query per
#: process per interval, and only while requests arrive: never one per request. Longer
#: than `version.VERSION_EVERY`: on Redis the version, one GET, tells first.
DB_CHECK_EVERY = 2.0
#: At most this many clients' limits are kept per policy (see `CompiledPolicy.limit_for`).
LIMITS_KEPT = 4_096
#: A policy's `counting` when each process counts it alone, in its in-process engine.
PER_PROCESS = "per_process"

Fingerprint = tuple[tuple[int, Any], ...]


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


def in_rollout(name: str, identity: str, rollout: int) -> bool:
    """Whether a policy rolled out to `rollout` percent of clients is enforced for this
    one: a draw from the policy's name and the client, keyed with a secret derived from
    `SECRET_KEY` (`_rollout_key`). The same in every process, on every machine and after a
    restart, and a client in at 5% stays in at 25%; without the secret no one can tell
    which values of a key a client chooses (a header, a query value) fall outside."""
    raw = name.encode("utf-8", "surrogatepass") + b"\0" + identity.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(raw, digest_size=8, key=_rollout_key(settings.SECRET_KEY)).digest()
    return int.from_bytes(digest, "big") % 100 < rollout


@functools.lru_cache(maxsize=4)
def _rollout_key(secret: str | bytes) -> bytes:
    """The key of the rollout draw, derived from `secret` (the site's `SECRET_KEY`) for
    this use alone: keyed BLAKE2b is a MAC, and knowing the draw of some clients tells
    nothing of the secret or of other clients' draws. Another SECRET_KEY draws anew."""
    return salted_hmac("ratelimits.rollout", "the rollout draw", secret=secret,
                       algorithm="sha256").digest()


runtime.on_reset(_rollout_key.cache_clear)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """One enabled policy with its key, pattern and engine limit parsed once."""

    id: int
    name: str
    mode: str
    key: str  # as written: "ip", "header:X-Api-Key"
    key_spec: Any  # ratelimits.matching.keykinds.KeySpec
    pattern: Any  # ratelimits.matching.paths.PathPattern
    methods: frozenset[str]  # empty: every method
    scope: str  # "": not tied to a DRF scope
    on_error: str
    priority: int
    template: Limit  # the engine limit with an empty client key
    counting: str = "shared"  # "per_process": decided in this process alone
    rollout: int = 100  # percent of clients an enforced policy is enforced for
    overrides: OverrideTable | None = None  # None: the policy has none
    #: The responses charged (None: every admitted request, charged before the view) and
    #: those that clear the client's count (None: none); see `pipeline.settling`.
    charge_on: ResponseRule | None = None
    reset_on: ResponseRule | None = None
    #: A function of the request giving its cost (None: the template's).
    cost_of: Callable[[Any], Any] | None = None
    #: The limits `limit_for` built for clients without an override rule, by identity:
    #: a Limit is immutable and, without a rule, a function of the identity alone.
    limits: dict[str, Limit] = field(default_factory=dict, init=False, compare=False,
                                     repr=False)
    #: The template's values of `_TEMPLATE_FIELDS`, read once.
    template_values: tuple[Any, ...] = field(init=False, compare=False, repr=False)
    #: Derived once, for the request path. `in_process`: decided in this process (per
    #: process, or adaptive), not in the store. `may_wait`: a client's limit may admit
    #: with a delay (a `max_wait`, or an algorithm that queues; overrides change neither).
    #: `settles`: its response may charge or clear the count (`charge_on`, `reset_on`).
    in_process: bool = field(init=False, compare=False, repr=False)
    may_wait: bool = field(init=False, compare=False, repr=False)
    settles: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        template = self.template
        _set(self, "template_values", tuple(getattr(template, name) for name in _TEMPLATE_FIELDS))
        _set(self, "in_process", self.counting == PER_PROCESS or template.spec.learned)
        _set(self, "may_wait", template.max_wait > 0 or template.spec.delays)
        _set(self, "settles", self.charge_on is not None or self.reset_on is not None)

    @property
    def shadow(self) -> bool:
        return self.template.shadow

    @property
    def key_kind(self) -> str:
        """The kind of key for logs: "ip", "user", "header" ... never the client's value."""
        return self.key.split(":", 1)[0]

    def applies_to(
        self, path: str, method: str, scopes: frozenset[str], as_get: bool = False
    ) -> bool:
        """Whether the policy looks at a request; `as_get`: its view answers `method`
        with the body it answers GET with (see `routing.answered_as_get`), so a policy
        on GET counts it too."""
        methods = self.methods
        return (
            self.scope in scopes
            and (not methods or method in methods or (as_get and "GET" in methods))
            and self.pattern.matches(path)
        )

    def limit_for(self, identity: str, rule: Rule | None = None) -> Limit:
        """The engine limit for one client: the template with its key set, with the limit
        and burst of the override `rule` that applies to it, in shadow when the policy's
        rollout leaves this client out.

        The template was validated when the policy was compiled and only the key
        differs, so the copy skips `Limit.__post_init__` (it runs per policy per request),
        and is kept for the client's next request when no rule applies.
        """
        if rule is None:
            kept = self.limits.get(identity)
            if kept is not None:
                return kept
        limit = _new_limit(Limit)
        _SET_KEY(limit, identity)
        template = self.template
        for set_slot, value in zip(_SET_TEMPLATE, self.template_values, strict=True):
            set_slot(limit, value)
        if rule is not None and rule.template is not None:
            for name in _OVERRIDDEN:
                _set(limit, name, getattr(rule.template, name))
        if self.rollout < 100 and not template.shadow and not in_rollout(
            self.name, identity, self.rollout
        ):
            _set(limit, "shadow", True)  # not yet enforced for this client: counted as shadow
        if rule is None:
            if len(self.limits) >= LIMITS_KEPT:
                self.limits.clear()  # many clients: start again rather than grow
            self.limits[identity] = limit
        return limit


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The enabled policies at one policy version, most important first."""

    version: int | None
    policies: tuple[CompiledPolicy, ...] = ()
    fingerprint: Fingerprint | None = None  # of the tables when it was read
    #: user pk -> the names of the groups that group overrides name, it belongs to
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: The DRF scopes some policy is tied to (empty: no policy has one); derived.
    scopes: frozenset[str] = frozenset()
    #: `registry.generation` when it was compiled: a snapshot older than the limits
    #: declared in code is built again (see `Registry.generation`).
    declarations: int = -1
    #: A snapshot pinned by `ratelimits.testing`: the policies it was given (None: it was
    #: read from the database), so it can be compiled again with newer declarations.
    given: tuple[Any, ...] | None = None

    #: The policies of each scope ('' for those without one), in `policies`' order.
    by_scope: Mapping[str, tuple[CompiledPolicy, ...]] = field(
        init=False, compare=False, repr=False)
    #: What each method and path asks of this snapshot, worked out at its first request
    #: (`routing.route_of`): held here, so a newer snapshot starts with none.
    routes: dict[Any, Any] = field(default_factory=dict, init=False, compare=False,
                                   repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scopes", frozenset(p.scope for p in self.policies if p.scope))
        by_scope: dict[str, list[CompiledPolicy]] = {}
        for policy in self.policies:
            by_scope.setdefault(policy.scope, []).append(policy)
        object.__setattr__(self, "by_scope", {s: tuple(ps) for s, ps in by_scope.items()})

    def matching(
        self, path: str, method: str, scopes: frozenset[str], exclude: frozenset[int] | set[int],
        as_get: bool = False,
    ) -> list[CompiledPolicy]:
        """The policies of `scopes` that apply to `path` and `method` (and to GET too when
        `as_get`), most important first, but those in `exclude` (ids)."""
        if len(scopes) == 1:  # a request's usual case: one scope's policies, not all
            (scope,) = scopes
            candidates = self.by_scope.get(scope, ())
        else:
            candidates = self.policies
        return [
            p for p in candidates
            if p.id not in exclude and p.applies_to(path, method, scopes, as_get)
        ]


def compile_policy(policy: Any, overrides: Iterable[Any] = ()) -> CompiledPolicy:
    """Parse one `Policy` row and its `Override` rows; ValueError when the policy is
    invalid (saved around clean()); an invalid override is skipped."""
    from ratelimits.models import split_methods  # not at the top: see table_fingerprint

    return CompiledPolicy(
        id=policy.pk,
        name=policy.name,
        mode=policy.mode,
        key=policy.key,
        key_spec=parse_key(policy.key),
        pattern=PathPattern(policy.path),
        methods=_with_head(frozenset(split_methods(policy.methods))),
        scope=policy.scope,
        on_error=policy.on_error,
        priority=policy.priority,
        template=_held_at_most(policy.as_limit(""), get_config()["MAX_DELAY"]),
        counting=policy.counting,
        rollout=_rollout(policy),
        overrides=_compile_overrides(policy, _overridable(policy, overrides)),
        charge_on=parse_responses(getattr(policy, "charge_on", ""), CHARGE_WORD),
        reset_on=_reset_on(policy),
        cost_of=_cost_function(policy),
    )


def _cost_function(policy: Any) -> Callable[[Any], Any] | None:
    """The function giving a request's cost under `policy`: the one its declaration in
    code was given, or the one its `cost_function` names (one that cannot be imported
    is logged, and the policy's cost is charged)."""
    from django.utils.module_loading import import_string

    declaration = registry.declared.get(policy.name) if policy.declared else None
    if declaration is not None and declaration.cost_of is not None:
        return declaration.cost_of
    from ratelimits.models import cost_function_error  # not at the top: see table_fingerprint

    path = (getattr(policy, "cost_function", "") or "").strip()
    if not path:
        return None
    error = cost_function_error(path)  # also for a row saved before the shape was checked
    if error is not None:
        logger.error("ratelimits: policy %r: its cost function is not used: %s Each request "
                     "is charged the policy's cost, %s.", policy.name, error, policy.cost)
        return None
    return import_string(path)  # type: ignore[no-any-return]  # a function, checked above


def _rollout(policy: Any) -> int:
    """The policy's rollout; 0 (no client in: watched as in shadow) for a row saved before
    `Policy.clean()` refused its rollout (`models.rollout_error`: a `global` key), which
    would otherwise be enforced for everyone or no one by the luck of one draw."""
    from ratelimits.models import rollout_error  # not at the top: see table_fingerprint

    error = rollout_error(policy.key, policy.rollout)
    if error is None:
        return int(policy.rollout)
    logger.error("ratelimits: policy %r is enforced for no client until its rollout is "
                 "100: %s", policy.name, error)
    return 0


def _reset_on(policy: Any) -> ResponseRule | None:
    """The responses that clear a client's count under `policy`; none for a row saved
    before `Policy.clean()` refused its reset (`models.reset_error`: a key that is not an
    account), which would let any client clear the count of its guesses."""
    from ratelimits.models import reset_error  # not at the top: see table_fingerprint

    text = getattr(policy, "reset_on", "")
    error = reset_error(policy.key, text)
    if error is None:
        return parse_responses(text, RESET_WORD)
    logger.error("ratelimits: policy %r clears no count until its reset_on is cleared or "
                 "its key counts per account: %s", policy.name, error)
    return None


def _overridable(policy: Any, overrides: Iterable[Any]) -> Iterable[Any]:
    """`overrides`, or none for an adaptive policy (it has no clients to override;
    `Override.clean()` refuses them, and these were saved before it became one)."""
    if policy.algorithm not in LEARNED_ALGORITHMS:
        return overrides
    for row in overrides:
        logger.error("ratelimits: override %r of policy %r is skipped: an adaptive policy "
                     "takes none", row.match, policy.name)
    return ()


def _held_at_most(template: Limit, max_delay: float) -> Limit:
    """A limit that would hold a request longer than `MAX_DELAY` (a max wait above it, or
    a queue that drains later than it, the max wait included), cut to what it allows: the
    request that would wait longer is refused (and not charged) instead of being served
    early. `Policy.clean()` refuses such a limit; this keeps rows saved before that rule,
    or before `MAX_DELAY` was lowered, honest."""
    if template.max_wait > max_delay:
        template = dataclasses.replace(template, max_wait=max_delay)
    spec = REGISTRY[template.algorithm]
    if not spec.delays:
        return template
    queue = spec.queue_within(template, max_delay - template.max_wait)
    return dataclasses.replace(template, burst=queue) if spec.burst_of(template) > queue \
        else template


def _with_head(methods: frozenset[str]) -> frozenset[str]:
    # Django answers HEAD with the GET view: a limit on GET must hold for HEAD too.
    return methods | {"HEAD"} if "GET" in methods else methods


def _order(p: CompiledPolicy) -> tuple[int, int, str]:
    return (-p.priority, -p.pattern.specificity, p.name)


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
    return Snapshot(version=version, policies=tuple(sorted(compiled, key=_order)),
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
    return Snapshot(version=None, policies=tuple(sorted(compiled, key=_order)),
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


def _compile_overrides(policy: Any, rows: Iterable[Any]) -> OverrideTable | None:
    """A policy's overrides as one table; an invalid one is logged and skipped."""
    pairs = []
    prefix, max_delay = get_config()["IPV6_PREFIX"], get_config()["MAX_DELAY"]
    templates: dict[Limit, Limit] = {}  # overrides giving the same limit share one
    for row in rows:
        try:
            match = parse_match(policy.key, row.match, prefix)
            template = None if row.exempt else _held_at_most(row.as_limit(policy, ""),
                                                             max_delay)
            if template is not None:
                template = templates.setdefault(template, template)
        except (ValueError, TypeError) as exc:
            logger.error("ratelimits: override %r of policy %r is invalid and is skipped: %s",
                         row.match, policy.name, exc)
            continue
        expires = None if row.expires is None else row.expires.timestamp()
        pairs.append((match, Rule(row.pk, row.exempt, template, expires)))
    return OverrideTable.of(pairs) if pairs else None


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
            return new
        finally:
            self._lock.release()


resolver = Resolver()
runtime.on_reset(resolver.reset)


@receiver(setting_changed, dispatch_uid="ratelimits.resolver.settings")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "RATELIMITS":
        resolver.invalidate(None)  # compiled with the old settings (MAX_DELAY)
