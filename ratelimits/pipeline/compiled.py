"""Compiled policies: a `Policy` row and its overrides made ready for the request path
(`CompiledPolicy`: its key reader, path pattern, engine limit template and override table,
and each client's limit kept), and the immutable `Snapshot` of the enabled ones at one
policy version, with the routes its requests asked for (see `routing.route_of`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
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
from ratelimits.pipeline.declared import registry

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

#: At most this many clients' limits are kept per policy (see `CompiledPolicy.limit_for`).
LIMITS_KEPT = 4_096
#: A policy's `counting` when each process counts it alone, in its in-process engine.
PER_PROCESS = "per_process"
Fingerprint = tuple[tuple[int, Any], ...]


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
    #: `learned`: an adaptive limit, decided in this process's adaptive engine (an
    #: override changes a limit's figures, never its algorithm).
    in_process: bool = field(init=False, compare=False, repr=False)
    learned: bool = field(init=False, compare=False, repr=False)
    may_wait: bool = field(init=False, compare=False, repr=False)
    settles: bool = field(init=False, compare=False, repr=False)
    #: Its limit holds slots while a request runs (concurrency, adaptive): no window.
    holds_slots: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        template = self.template
        _set(self, "template_values", tuple(getattr(template, name) for name in _TEMPLATE_FIELDS))
        _set(self, "learned", template.spec.learned)
        _set(self, "in_process", self.counting == PER_PROCESS or self.learned)
        _set(self, "may_wait", template.max_wait > 0 or template.spec.delays)
        _set(self, "settles", self.charge_on is not None or self.reset_on is not None)
        _set(self, "holds_slots", template.spec.holds_slots)

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


def policy_order(p: CompiledPolicy) -> tuple[int, int, str]:
    return (-p.priority, -p.pattern.specificity, p.name)


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
