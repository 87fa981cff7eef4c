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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.dateparse import parse_datetime

from ratelimits.models import Override, Policy

FORMAT = "ratelimits.policies"
VERSION = 1
#: Fields of a policy or an override that a file does not carry: the database's and the
#: clock's, and an override's policy (it is nested in its policy).
NOT_EXPORTED = frozenset({"id", "created", "updated", "policy"})
OVERRIDES = "overrides"


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
    and for an update the fields as (name, old, new)."""

    action: str
    name: str
    fields: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)
    policy: Any = None  # the row (a policy or an override) to save, or to delete

    def describe(self) -> str:
        if self.action != "update":
            return f"{self.action} {self.name}"
        shown = "; ".join(f"{f} {old!r} -> {new!r}" for f, old, new in self.fields)
        return f"update {self.name}: {shown}"


def plan_import(data: Any, *, delete_missing: bool = False) -> list[Change]:
    """What importing `data` (a parsed file) changes, every policy and override validated
    first; PolicyFileError listing every problem when anything is wrong. Writes nothing."""
    entries = _entries(data)
    fields = exported_fields()
    existing = {p.name: p for p in Policy.objects.all()}
    editable = {p.name: p for p in Policy.objects.all()}  # a copy of each to change
    changes: list[Change] = []
    problems: list[str] = []
    for where, entry in entries:
        unknown = sorted(set(entry) - set(fields) - {OVERRIDES})
        if unknown:
            problems.append(f"{where}: unknown field(s) {', '.join(unknown)}; the fields "
                            f"are {', '.join(fields)}, {OVERRIDES}")
            continue
        name = entry["name"]
        old = existing.get(name)
        policy = editable.get(name) or Policy()
        for field in fields:
            if field in entry:
                setattr(policy, field, entry[field])
        try:
            policy.full_clean()
        except ValidationError as exc:
            problems += [f"{where}: {field}: {' '.join(messages)}"
                         for field, messages in exc.message_dict.items()]
            continue
        if old is None:
            changes.append(Change("create", name, policy=policy))
        else:
            diff = [(f, getattr(old, f), getattr(policy, f)) for f in fields
                    if getattr(old, f) != getattr(policy, f)]
            changes.append(Change("update" if diff else "unchanged", name, diff, policy))
        if OVERRIDES in entry:
            changes += _plan_overrides(where, policy, old, entry[OVERRIDES], problems)
    if problems:
        raise PolicyFileError("\n".join(problems))
    if delete_missing:
        named = {entry["name"] for _, entry in entries}
        changes += [Change("delete", name, policy=p)
                    for name, p in sorted(existing.items()) if name not in named]
    return changes


def _plan_overrides(where: str, policy: Any, old: Any, given: Any,
                    problems: list[str]) -> list[Change]:
    """A policy's overrides as the file gives them: all of them, by match."""
    fields = exported_fields(Override)
    if not isinstance(given, list):
        problems.append(f"{where}: {OVERRIDES} must be a list")
        return []
    current = {o.match: o for o in old.overrides.all()} if old is not None else {}
    changes, seen = [], set()
    for i, item in enumerate(given, 1):
        at = f"{where} override {i}"
        if not isinstance(item, dict) or not isinstance(item.get("match"), str):
            problems.append(f"{at}: must be an object with a \"match\"")
            continue
        unknown = sorted(set(item) - set(fields))
        if unknown:
            problems.append(f"{at}: unknown field(s) {', '.join(unknown)}; the fields are "
                            f"{', '.join(fields)}")
            continue
        values = dict(item)
        if isinstance(values.get("expires"), str):
            values["expires"] = parse_datetime(values["expires"]) or values["expires"]
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
            problems += [f"{at} {item['match']!r}: {field}: {' '.join(messages)}"
                         for field, messages in exc.message_dict.items()]
            continue
        if override.match in seen:
            problems.append(f"{at}: {override.match!r} appears twice for this policy")
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


def apply(changes: list[Change]) -> None:
    """Write the planned changes in one transaction (all or nothing); the policy
    version is published once it commits, as for an edit in the admin."""
    with transaction.atomic():
        for change in changes:  # a policy comes before its overrides
            if change.action in ("create", "update"):
                change.policy.save()  # an override takes its new policy's pk (Django)
            elif change.action == "delete":
                change.policy.delete()


def read(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyFileError(f"not JSON: {exc}") from exc


def dumps(content: Mapping[str, Any]) -> str:
    return json.dumps(content, indent=2, ensure_ascii=False) + "\n"


def _entries(data: Any) -> list[tuple[str, dict[str, Any]]]:
    """The file's policies, each with where it is ("policy 2 'login'"), checked for
    shape: a mapping with a string name, each name once."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PolicyFileError(f"not a policy file: expected an object with "
                              f"\"format\": {FORMAT!r} (write one with `ratelimits export`)")
    if data.get("version") != VERSION:
        raise PolicyFileError(f"version {data.get('version')!r} is not one this release "
                              f"reads ({VERSION})")
    policies = data.get("policies")
    if not isinstance(policies, list):
        raise PolicyFileError('"policies" must be a list')
    out, seen, problems = [], set(), []
    for i, entry in enumerate(policies, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            problems.append(f"policy {i}: must be an object with a \"name\"")
            continue
        name = entry["name"]
        if name in seen:
            problems.append(f"policy {i}: {name!r} appears twice; names are unique")
            continue
        seen.add(name)
        out.append((f"policy {i} {name!r}", entry))
    if problems:
        raise PolicyFileError("\n".join(problems))
    return out
