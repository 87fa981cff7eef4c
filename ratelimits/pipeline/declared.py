"""Limits declared in code (`@ratelimit`): each is a policy whose rate the code owns.

A declaration becomes a `Policy` row marked `declared` the first time a process loads
its snapshot with it (and at `migrate`), so the admin shows its counters, charts and
offenders like any other and an operator can switch it to shadow or off, roll it out or
add overrides without a deploy. Its rate (algorithm, limit, period, burst, cost, key,
methods) stays what the running code says: the snapshot compiles the row with the
code's figures laid over it, whatever the row holds.

A declared policy applies to its decorated views only: its `scope` is `code:<name>`,
which the decorator asks for (as `PolicyThrottle` asks for a view's `throttle_scope`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError

from ratelimits.matching.identity import register_reader

logger = logging.getLogger("ratelimits")

#: The prefix of a declared policy's scope.
SCOPE_PREFIX = "code:"
#: The attribute a decorated view carries: the scopes of its declared limits (the
#: middleware leaves such a request to the decorator, see `evaluation.throttle_decides`).
SCOPES_ATTR = "ratelimit_scopes"
#: The fields the code owns; the operator owns the rest (mode after the first start,
#: rollout, on_error, priority, description, overrides).
CODE_FIELDS = ("algorithm", "limit", "period", "burst", "cost", "max_wait", "warmup", "key",
               "methods", "path", "scope", "charge_on", "reset_on", "lockout", "calendar")


@dataclass(frozen=True)
class Declaration:
    """One `@ratelimit`: a policy's fields as the code gives them."""

    name: str
    fields: tuple[tuple[str, Any], ...]  # CODE_FIELDS' values, then "mode"
    #: A function of the request giving its cost (`@ratelimit(cost=...)`), else None.
    cost_of: Callable[[Any], Any] | None = None
    #: A function giving fields the operator owns that a new row starts with (a compat
    #: layer's `on_error` from its library's setting), called when the row is made, so
    #: it may read the settings; else None.
    initial: Callable[[], Mapping[str, Any]] | None = None

    @property
    def scope(self) -> str:
        return SCOPE_PREFIX + self.name

    @property
    def code(self) -> dict[str, Any]:
        """The values of `CODE_FIELDS`."""
        return {k: v for k, v in self.fields if k in CODE_FIELDS}

    @property
    def mode(self) -> str:
        """The mode a new row starts in (later, the operator's)."""
        return str(dict(self.fields)["mode"])

    def policy(self, row: Any = None) -> Any:
        """`row` with the code's figures laid over it, or a new unsaved policy."""
        # Not at the top: the pytest plugin (through the resolver) and `ratelimits.decorators`
        # import this module before the app registry is ready.
        from ratelimits.models import Policy

        if row is None:
            start = {} if self.initial is None else dict(self.initial())
            row = Policy(name=self.name, mode=self.mode, declared=True, **start)
        for name, value in self.code.items():
            setattr(row, name, value)
        return row

    def differs(self, row: Any) -> bool:
        """Whether the row holds other figures than the code's."""
        return any(getattr(row, k) != v for k, v in self.code.items()) or not row.declared


class Registry:
    """The declarations of this process, by name, and which were written to the table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.declared: dict[str, Declaration] = {}
        self._written: set[str] = set()
        #: Moves with every new declaration. A snapshot remembers the generation it was
        #: compiled at, so a view module imported after the first request (gunicorn imports
        #: the URLconf at the first `resolve()`, long after the middleware was built) has
        #: its limits applied from its first request on.
        self.generation = 0
        #: Functions that declare limits no import declares (see `finder`).
        self._finders: list[Callable[[], object]] = []

    def finder(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Register `fn`, which declares limits found by looking (the DRF compat
        throttles of the routed views), for `find()`; returns it (a decorator)."""
        with self._lock:
            if fn not in self._finders:
                self._finders.append(fn)
        return fn

    def find(self) -> None:
        """Run every finder (at `migrate`, once the URLconf is imported): what they
        declare gets its row with the others'. A failing finder is logged."""
        for fn in list(self._finders):
            try:
                fn()
            except Exception as exc:
                logger.warning("ratelimits: could not look for limits declared in code "
                               "(%s: %s); they are declared at their first request",
                               type(exc).__name__, exc)

    def declare(
        self, name: str, mode: str, *, reader: Callable[[Any], Any] | None = None,
        cost_of: Callable[[Any], Any] | None = None, replace: bool = False,
        initial: Callable[[], Mapping[str, Any]] | None = None, **code: Any
    ) -> Declaration:
        """Register a declaration; ImproperlyConfigured when it is invalid or the same
        name was declared with other figures (two views may share one declaration),
        unless `replace`: then the new figures apply from the next request on (a rate
        read from settings that changed). `reader`, a function of the request,
        identifies the client instead of `key` (which becomes `code:<name>`); `cost_of`,
        a function of the request, gives its cost instead of `cost`; `initial` gives the
        operator's fields a new row starts with (see `Declaration.initial`)."""
        from ratelimits.models import Mode  # not at the top: see `Declaration.policy`

        if reader is not None:
            code["key"] = f"code:{name}"

        code.setdefault("path", "*")
        for name_, default in (("charge_on", ""), ("reset_on", ""), ("lockout", 0),
                               ("calendar", "")):
            code.setdefault(name_, default)
        code["scope"] = SCOPE_PREFIX + name
        if mode not in Mode.values:
            raise ImproperlyConfigured(
                f"@ratelimit(name={name!r}): mode {mode!r} is not one of "
                f"{', '.join(Mode.values)}"
            )
        declaration = Declaration(name, (*((k, code[k]) for k in CODE_FIELDS), ("mode", mode)),
                                  cost_of, initial)
        policy = declaration.policy()
        try:
            policy.full_clean(validate_unique=False)
        except ValidationError as exc:
            problems = "; ".join(
                f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items()
            )
            raise ImproperlyConfigured(f"@ratelimit(name={name!r}): {problems}") from None
        # clean() normalises (methods "post" -> "POST"): keep what it made of them
        declaration = Declaration(
            name, (*((k, getattr(policy, k)) for k in CODE_FIELDS), ("mode", mode)), cost_of,
            initial,
        )
        with self._lock:
            known = self.declared.get(name)
            if known is not None and known != declaration and not replace:
                raise ImproperlyConfigured(
                    f"@ratelimit(name={name!r}) is declared twice with different figures "
                    f"({dict(known.fields)} and {dict(declaration.fields)}): give each "
                    "its own name, or the same figures to share one limit"
                )
            if known != declaration:
                self.declared[name] = declaration
                self.generation += 1
                self._written.discard(name)  # its row takes the new figures
            if reader is not None:  # the latest function: a re-imported module's own
                register_reader(name, reader)
        return declaration

    def compile_rows(self, rows: list[Any]) -> list[Any]:
        """The policies to compile for a snapshot: `rows` with each declared row given its
        code's figures (a declared row no code declares any more is left out), and a new
        unsaved policy for each declaration without a row (the write may have failed, or
        the snapshot is a test's). Writes the rows that are missing or differ, once per
        process per declaration."""
        by_name = {row.name: row for row in rows}
        out = []
        for row in rows:
            if not row.declared:
                out.append(row)
            elif row.name in self.declared:
                out.append(self.declared[row.name].policy(row))
        for declaration in self.declared.values():
            row = by_name.get(declaration.name)
            if row is None:
                out.append(declaration.policy())  # unsaved: see `numbered`
            elif not row.declared:
                logger.error(
                    "ratelimits: @ratelimit(name=%r): a policy of that name exists and was "
                    "not declared in code, so the declaration has no row of its own (no "
                    "admin, no overrides) and the two share counters; rename one of them",
                    declaration.name,
                )
                out.append(declaration.policy())
        return out

    def write(self, rows: list[Any] | None = None, *, force: bool = False) -> list[Any]:
        """Create or update the rows of this process's declarations (each at most once per
        process unless `force`); returns the rows that `rows` lacked, as the table now
        holds them. A failure is logged.

        Several processes may create the same rows at once (a deploy's workers, each at
        its first request): a row is inserted only if none of its name exists, never
        failing on one another process inserted first, and every process then reads back
        the row that is there, whoever wrote it, so their snapshots agree. Inserting
        publishes nothing: a policy version moved in the middle of another process's
        request would make it decide that request again on the new snapshot."""
        from ratelimits.models import Policy  # not at the top: see `Declaration.policy`

        with self._lock:
            todo = [d for d in self.declared.values() if force or d.name not in self._written]
            self._written.update(d.name for d in todo)
        if not todo:
            return []
        try:
            if rows is None:
                rows = list(Policy.objects.filter(name__in=[d.name for d in todo]))
            by_name = {row.name: row for row in rows}
            missing = []
            for declaration in todo:
                row = by_name.get(declaration.name)
                if row is None:
                    missing.append(declaration.policy())
                elif row.declared and declaration.differs(row):
                    declaration.policy(row).save()  # the code's new figures: published
                # a row not declared is an operator's policy of that name: see compile_rows
            if not missing:
                return []
            Policy.objects.bulk_create(missing, ignore_conflicts=True)
            return list(Policy.objects.filter(name__in=[p.name for p in missing]))
        except Exception as exc:
            logger.error("ratelimits: could not write the limits declared in code (%s); "
                         "they apply with the code's figures meanwhile", exc)
            return []

    def restore(self, declared: dict[str, Declaration]) -> None:
        """Go back to `declared` (a copy of `self.declared` taken before): a test's own
        declarations end with it, and snapshots compiled with them are built again."""
        with self._lock:
            self.declared = dict(declared)
            self.generation += 1
            self._written.clear()

    def forget_written(self) -> None:
        with self._lock:
            self._written.clear()


def numbered(policies: list[Any]) -> list[Any]:
    """`policies` with each unsaved one given an id no saved row has (negative)."""
    for i, policy in enumerate((p for p in policies if p.pk is None), 1):
        policy.pk = -i
    return policies


registry = Registry()
