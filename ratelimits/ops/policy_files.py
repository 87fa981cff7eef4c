"""Policies as files: `manage.py ratelimits export` and `ratelimits import FILE`.

A file holds every policy by name with its editable fields and its overrides, so rules
move from staging to production and live in version control. An import validates every
policy and override with the admin's rules (`full_clean()`) before it writes anything,
then applies all of them in one transaction, or none.

    {"format": "ratelimits.policies", "version": 1,
     "policies": [{"name": "login", "mode": "enforce", "limit": 5, ...,
                   "overrides": [{"match": "ip:10.0.0.0/8", "exempt": true, ...}]}]}

A policy's "overrides" in a file are all of its overrides: an import creates, updates
(by `match`) and deletes them to match. A policy given without "overrides" keeps its own.

A file is read strictly: each value has the JSON type an export writes (5, not "5", 5.0
or true), each key appears once, a date carries its UTC offset. Whatever Django would
quietly convert is refused, with the policy and the field to fix.

A policy declared in code (`declared`, see `pipeline.declared`) keeps its flag and the
figures its code owns; an import sets the rest. A file cannot make a policy declared
that no code declares: the row would match no code, and so limit nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError, models, transaction
from django.urls import get_resolver
from django.utils.dateparse import parse_datetime

from ratelimits.models import Override, Policy
from ratelimits.pipeline.declared import CODE_FIELDS, Declaration, registry

FORMAT = "ratelimits.policies"
VERSION = 1
#: Fields of a policy or an override that a file does not carry: the database's and the
#: clock's, and an override's policy (it is nested in its policy).
NOT_EXPORTED = frozenset({"id", "created", "updated", "policy"})
OVERRIDES = "overrides"
#: The keys of a file's top-level object.
TOP_KEYS = ("format", "version", "policies")
#: The largest file an import reads: an export of a hundred thousand overrides fits; a log
#: or a dump named by mistake is refused before it is parsed into memory.
MAX_BYTES = 32 * 2**20
#: What an import keeps of a policy declared in code: its flag, the figures the code lays
#: over the row whatever it holds, and what the admin shows read-only beside them. Mode,
#: rollout, priority, on_error, description and overrides are the operator's.
DECLARED_KEEPS = frozenset({"declared", *CODE_FIELDS, "counting", "batch"})
#: Longest text of a value or a name quoted in a message.
_QUOTED = 60


class PolicyFileError(ValueError):
    """The file cannot be imported; the message says where and what to fix."""


def exported_fields(model: Any = None) -> list[str]:
    """The fields a file carries of a policy (or of `model`), in the model's order."""
    model = model or Policy
    return [f.name for f in model._meta.concrete_fields
            if f.name not in NOT_EXPORTED and f.attname not in NOT_EXPORTED]


def _value(obj: Any, field: str) -> Any:
    value = getattr(obj, field)
    return value.isoformat() if hasattr(value, "isoformat") else value


def export_policies() -> dict[str, Any]:
    """Every policy, by name, with its editable fields and its overrides (the file's
    whole content)."""
    fields, sub = exported_fields(), exported_fields(Override)
    policies = []
    for p in Policy.objects.order_by("name").prefetch_related(OVERRIDES):
        entry = {f: _value(p, f) for f in fields}
        entry[OVERRIDES] = [{f: _value(o, f) for f in sub}
                            for o in sorted(p.overrides.all(), key=lambda o: o.match)]
        policies.append(entry)
    return {"format": FORMAT, "version": VERSION, "policies": policies}


@dataclasses.dataclass
class Change:
    """What an import does to one policy: "create", "update", "delete" or "unchanged",
    for an update the fields as (name, old, new), and a note (what it kept, and why)."""

    action: str
    name: str
    fields: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)
    policy: Any = None  # the row (a policy or an override) to save, or to delete
    note: str = ""

    def describe(self) -> str:
        text = f"{self.action} {self.name}"
        if self.action == "update":
            shown = "; ".join(f"{f} {old!r} -> {new!r}" for f, old, new in self.fields)
            text = f"update {self.name}: {shown}"
        return f"{text} ({self.note})" if self.note else text


# -- reading ---------------------------------------------------------------------------


class _Object(dict[str, Any]):
    """A JSON object as the file gives it: `repeated`, the keys it gives more than once
    (json keeps the last one, silently)."""

    repeated: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) < len(pairs):
        obj.repeated = tuple(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
    return obj


def _no_constant(name: str) -> float:
    raise PolicyFileError(f"not JSON: {name} is not a JSON number; give a number")


def read(raw: bytes | str) -> Any:
    """The parsed file; PolicyFileError when it is too large, not UTF-8 or not JSON."""
    if len(raw) > MAX_BYTES:
        raise PolicyFileError(f"larger than {MAX_BYTES // 2**20} MB, which no export of "
                              "policies reaches: is it the file `ratelimits export` wrote?")
    text = raw if isinstance(raw, str) else _decoded(raw)
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except PolicyFileError:
        raise
    except json.JSONDecodeError as exc:
        raise PolicyFileError(f"not JSON: {exc}") from None
    except RecursionError:
        raise PolicyFileError("not a policy file: its values are nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise PolicyFileError(f"not JSON this command reads: {exc}") from None


def _decoded(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")  # a byte-order mark, as some editors write, is fine
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise PolicyFileError(
            f"not UTF-8: byte {raw[exc.start]:#04x} on line {line} is not a character in "
            "UTF-8; save the file as UTF-8 (export writes it so)") from None


def dumps(content: Mapping[str, Any]) -> str:
    return json.dumps(content, indent=2, ensure_ascii=False) + "\n"


def _quoted(value: Any) -> str:
    """`value` as JSON writes it, cut short for a message."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= _QUOTED else text[:_QUOTED - 3] + "..."


def _named(text: str) -> str:
    return repr(text if len(text) <= _QUOTED else text[:_QUOTED - 3] + "...")


def _keys(keys: list[str]) -> str:
    """Keys for a message: as written when they are names, quoted when they are not."""
    return ", ".join(k if k.isidentifier() else _named(k) for k in keys)


def _repeated(where: str, obj: Mapping[str, Any]) -> str | None:
    twice = obj.repeated if isinstance(obj, _Object) else ()
    if not twice:
        return None
    return f"{where}: {_keys(list(twice))} given twice; give each key once"


# -- what a file may give for a field --------------------------------------------------


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


#: What a file may give for each kind of model field (the first class that fits): what
#: an export writes, nothing Django would convert ("5" or true for 5, 5.5 for 5, 5 for "5").
_KINDS: tuple[tuple[type[models.Field[Any, Any]], str, Callable[[Any], bool]], ...] = (
    (models.BooleanField, "true or false", lambda v: isinstance(v, bool)),
    (models.IntegerField, "a whole number", _whole),
    (models.FloatField, "a number", _number),
    (models.DateTimeField, 'a date and time with its UTC offset, e.g. '
     '"2031-05-04T18:30:00+00:00"', lambda v: isinstance(v, str)),
    (models.CharField, "a string", lambda v: isinstance(v, str)),
    (models.TextField, "a string", lambda v: isinstance(v, str)),
)


def _checked(field: models.Field[Any, Any], value: Any) -> tuple[Any, str | None]:
    """`value` as the model takes it, and what is wrong with it (None: nothing)."""
    label, fits = next((label, fits) for kind, label, fits in _KINDS if isinstance(field, kind))
    if value is None:
        return None, None if field.null else f"null is not allowed; give {label}"
    if not fits(value):
        return value, f"{_quoted(value)} is not {label}"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value, f"{_quoted(value)} holds a lone surrogate (\\ud800-\\udfff), not text"
        if "\x00" in value:
            return value, f"{_quoted(value)} holds a NUL character (\\u0000); remove it"
        if isinstance(field, models.DateTimeField):
            return _when(value, label)
    return value, None


def _when(text: str, label: str) -> tuple[Any, str | None]:
    try:
        parsed = parse_datetime(text)
    except ValueError:  # well formed but no such date: "2031-02-30T10:00"
        parsed = None
    if parsed is None:
        return text, f"{_quoted(text)} is not {label}"
    if parsed.tzinfo is None:
        return text, f"{_quoted(text)} has no UTC offset; give {label}"
    return parsed, None


def _values(where: str, item: Mapping[str, Any], model: Any, allowed: list[str],
            problems: list[str]) -> dict[str, Any] | None:
    """`item`'s fields, each of the type its model field takes (a datetime parsed); None,
    with the problems added, when a key is unknown or repeated or a value is wrong."""
    unknown = sorted(set(item) - set(allowed))
    if unknown:
        problems.append(f"{where}: unknown field(s) {_keys(unknown)}; the "
                        f"fields are {', '.join(allowed)}")
        return None
    twice = _repeated(where, item)
    if twice:
        problems.append(twice)
        return None
    by_name = {f.name: f for f in model._meta.concrete_fields}
    values, wrong = {}, []
    for name, given in item.items():
        if name not in by_name:  # overrides: a list, see _plan_overrides
            values[name] = given
            continue
        values[name], problem = _checked(by_name[name], given)
        if problem:
            wrong.append(f"{where}: {name}: {problem}")
    problems += wrong
    return None if wrong else values


# -- planning ----------------------------------------------------------------------------


def plan_import(data: Any, *, delete_missing: bool = False) -> list[Change]:
    """What importing `data` (a parsed file) changes, every policy and override validated
    first; PolicyFileError listing every problem when anything is wrong. Writes nothing."""
    entries = _entries(data)
    existing = {p.name: p for p in Policy.objects.prefetch_related(OVERRIDES)}
    editable = {p.name: p for p in Policy.objects.all()}  # a copy of each to change
    changes: list[Change] = []
    problems: list[str] = []
    for where, entry in entries:
        name = entry["name"]
        changes += _plan_policy(where, entry, existing.get(name), editable.get(name),
                                problems)
    if problems:
        raise PolicyFileError("\n".join(problems))
    if delete_missing:
        named = {entry["name"] for _, entry in entries}
        for name, p in sorted(existing.items()):
            if name in named:
                continue
            if p.declared:  # its code writes the row again: the admin cannot delete it either
                changes.append(Change("unchanged", name, note="declared in code, so not "
                                      "deleted; switch it off instead"))
            else:
                changes.append(Change("delete", name, policy=p))
    return changes


def _plan_policy(where: str, entry: Mapping[str, Any], old: Any, row: Any,
                 problems: list[str]) -> list[Change]:
    """One policy of the file: its change, then its overrides'."""
    fields = exported_fields()
    values = _values(where, entry, Policy, [*fields, OVERRIDES], problems)
    if values is None:
        return []
    policy, keeps = _base(where, entry["name"], old, row, values.get("declared"), problems)
    if policy is None:
        return []
    kept = []
    for field in fields:
        if field not in values:
            continue
        if field in keeps:
            if values[field] != getattr(policy, field):
                kept.append(f"{field} {values[field]!r}")
            continue
        setattr(policy, field, values[field])
    try:
        policy.full_clean()
    except ValidationError as exc:
        problems += [f"{where}: {field}: {' '.join(messages)}"
                     for field, messages in exc.message_dict.items()]
        return []
    note = (f"declared in code, so the file's {', '.join(kept)} "
            f"{'is' if len(kept) == 1 else 'are'} not applied") if kept else ""
    if old is None:
        changes = [Change("create", policy.name, policy=policy, note=note)]
    else:
        diff = [(f, getattr(old, f), getattr(policy, f)) for f in fields
                if getattr(old, f) != getattr(policy, f)]
        changes = [Change("update" if diff else "unchanged", policy.name, diff, policy, note)]
        if diff and OVERRIDES not in values:
            _recheck_overrides(where, policy, old, problems)
    if OVERRIDES in values:
        changes += _plan_overrides(where, policy, old, values[OVERRIDES], problems)
    return changes


def _base(where: str, name: str, old: Any, row: Any, declared: Any,
          problems: list[str]) -> tuple[Any, frozenset[str]]:
    """The policy the file's values are laid over, and the fields it keeps whatever the
    file says; (None, ...) with a problem added when the file asks for `declared` where
    no code declares the policy."""
    if old is not None and old.declared:
        return row, DECLARED_KEEPS  # the code's row: its flag and figures stay
    if not declared:
        return row or Policy(), frozenset()
    declaration = _declared_in_code(name) if old is None else None
    if declaration is not None:  # the code declares it; its row is not written yet
        return declaration.policy(), DECLARED_KEEPS
    if old is not None:
        problems.append(
            f"{where}: declared: true, but {_named(name)} is a policy of your own here, not "
            "one declared in code, and an import does not make it one; give \"declared\": "
            "false or leave it out")
    else:
        problems.append(
            f"{where}: declared: true marks a policy declared in code (@ratelimit, a DRF "
            f"compat throttle), and no code here declares {_named(name)}: such a row would "
            "limit nothing. Leave \"declared\" out (or false) to import it as a policy of "
            "your own, or import again once the code that declares it has written its row "
            "(at migrate, or at its first request)")
    return None, frozenset()


def _declared_in_code(name: str) -> Declaration | None:
    """The declaration of `name` by this process's code, once its URLconf (and with it
    the decorated views) is imported, as `migrate` does."""
    if name not in registry.declared:
        try:
            get_resolver().url_patterns  # noqa: B018  (the import is the point)
        except Exception:  # a broken URLconf declares nothing we can see
            return None
    return registry.declared.get(name)


def _plan_overrides(where: str, policy: Any, old: Any, given: Any,
                    problems: list[str]) -> list[Change]:
    """A policy's overrides as the file gives them: all of them, by match."""
    fields = exported_fields(Override)
    if not isinstance(given, list):
        problems.append(f"{where}: {OVERRIDES} must be a list of objects, not {_quoted(given)}")
        return []
    current = {o.match: o for o in old.overrides.all()} if old is not None else {}
    changes, seen = [], set()
    for i, item in enumerate(given, 1):
        at = f"{where} override {i}"
        if not isinstance(item, dict) or not isinstance(item.get("match"), str):
            problems.append(f"{at}: must be an object with a \"match\" (a string), not "
                            f"{_quoted(item)}")
            continue
        at = f"{at} {_named(item['match'])}"
        values = _values(at, item, Override, fields, problems)
        if values is None:
            continue
        override = current.get(item["match"].strip())
        before = {f: getattr(override, f) for f in fields} if override else None
        override = override or Override()
        override.policy = policy
        for field in fields:
            if field in values:
                setattr(override, field, values[field])
        try:
            override.full_clean(exclude=["policy"], validate_unique=False,
                                validate_constraints=False)
        except ValidationError as exc:
            problems += [f"{at}: {field}: {' '.join(messages)}"
                         for field, messages in exc.message_dict.items()]
            continue
        if override.match in seen:
            problems.append(f"{at}: {_named(override.match)} appears twice for this policy")
            continue
        seen.add(override.match)
        label = f"{policy.name} override {override.match}"
        if before is None:
            changes.append(Change("create", label, policy=override))
        else:
            diff = [(f, before[f], getattr(override, f)) for f in fields
                    if before[f] != getattr(override, f)]
            changes.append(Change("update" if diff else "unchanged", label, diff, override))
    changes += [Change("delete", f"{policy.name} override {match}", policy=o)
                for match, o in sorted(current.items()) if match not in seen]
    return changes


def _recheck_overrides(where: str, policy: Any, old: Any, problems: list[str]) -> None:
    """The overrides a changed policy keeps (the file gives no "overrides"), checked
    against it as the file leaves it: a new key or algorithm may not take them."""
    for override in old.overrides.all():
        override.policy = policy
        try:
            override.full_clean(exclude=["policy"], validate_unique=False,
                                validate_constraints=False)
        except ValidationError as exc:
            problems += [
                f"{where}: its override {_named(override.match)}, kept as the file gives no "
                f"\"{OVERRIDES}\", does not fit the policy as changed: {field}: "
                f"{' '.join(messages)}" for field, messages in exc.message_dict.items()]


def apply(changes: list[Change]) -> None:
    """Write the planned changes in one transaction (all or nothing); the policy
    version is published once it commits, as for an edit in the admin. PolicyFileError
    when the database refuses one (a policy created meanwhile by someone else)."""
    try:
        with transaction.atomic():
            for change in changes:  # a policy comes before its overrides
                if change.action in ("create", "update"):
                    change.policy.save()  # an override takes its new policy's pk (Django)
                elif change.action == "delete":
                    change.policy.delete()
    except DatabaseError as exc:
        raise PolicyFileError(f"the database refused a change ({exc}); run the import "
                              "again to plan it against the database as it is now") from exc


def _entries(data: Any) -> list[tuple[str, dict[str, Any]]]:
    """The file's policies, each with where it is ("policy 2 'login'"), checked for
    shape: a mapping with a string name, each name once."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PolicyFileError(f"not a policy file: expected an object with "
                              f"\"format\": {FORMAT!r} (write one with `ratelimits export`)")
    twice = _repeated("the file", data)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if twice or unknown:
        raise PolicyFileError(twice or f"unknown key(s) {_keys(unknown)} "
                              f"at the top of the file; it has {', '.join(TOP_KEYS)}")
    version = data.get("version")
    if not _whole(version) or version != VERSION:
        raise PolicyFileError(f"version {_quoted(version)} is not one this release "
                              f"reads ({VERSION})")
    policies = data.get("policies")
    if not isinstance(policies, list):
        raise PolicyFileError(f'"policies" must be a list, not {_quoted(policies)}')
    out, seen, problems = [], set(), []
    for i, entry in enumerate(policies, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            problems.append(f"policy {i}: must be an object with a \"name\" (a string), not "
                            f"{_quoted(entry)}")
            continue
        name = entry["name"]
        if name in seen:
            problems.append(f"policy {i}: {_named(name)} appears twice; names are unique")
            continue
        seen.add(name)
        out.append((f"policy {i} {_named(name)}", entry))
    if problems:
        raise PolicyFileError("\n".join(problems))
    return out
