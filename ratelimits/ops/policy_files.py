"""Policies as files: `manage.py ratelimits export` and `ratelimits import FILE`.

A file holds every policy by name with its editable fields, so rules move from staging to
production and live in version control. An import validates every policy with the
admin's rules (`full_clean()`) before it writes anything, then applies all of them in one
transaction, or none.

    {"format": "ratelimits.policies", "version": 1,
     "policies": [{"name": "login", "mode": "enforce", "limit": 5, ...}]}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

FORMAT = "ratelimits.policies"
VERSION = 1
#: Fields of a policy that a file does not carry: the database's and the clock's.
NOT_EXPORTED = frozenset({"id", "created", "updated"})


class PolicyFileError(ValueError):
    """The file cannot be imported; the message says where and what to fix."""


def exported_fields() -> list[str]:
    """The policy fields a file carries, in the model's order (name first)."""
    from ratelimits.models import Policy

    return [f.name for f in Policy._meta.concrete_fields if f.name not in NOT_EXPORTED]


def export_policies() -> dict[str, Any]:
    """Every policy, by name, with its editable fields (the file's whole content)."""
    from ratelimits.models import Policy

    fields = exported_fields()
    policies = [{f: getattr(p, f) for f in fields} for p in Policy.objects.order_by("name")]
    return {"format": FORMAT, "version": VERSION, "policies": policies}


@dataclasses.dataclass
class Change:
    """What an import does to one policy: "create", "update", "delete" or "unchanged",
    and for an update the fields as (name, old, new)."""

    action: str
    name: str
    fields: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)
    policy: Any = None  # the row to save (create, update) or delete

    def describe(self) -> str:
        if self.action != "update":
            return f"{self.action} {self.name}"
        shown = "; ".join(f"{f} {old!r} -> {new!r}" for f, old, new in self.fields)
        return f"update {self.name}: {shown}"


def plan_import(data: Any, *, delete_missing: bool = False) -> list[Change]:
    """What importing `data` (a parsed file) changes, every policy validated first;
    PolicyFileError listing every problem when anything is wrong. Writes nothing."""
    from ratelimits.models import Policy

    entries = _entries(data)
    fields = exported_fields()
    existing = {p.name: p for p in Policy.objects.all()}
    editable = {p.name: p for p in Policy.objects.all()}  # a copy of each to change
    changes: list[Change] = []
    problems: list[str] = []
    for where, entry in entries:
        unknown = sorted(set(entry) - set(fields))
        if unknown:
            problems.append(f"{where}: unknown field(s) {', '.join(unknown)}; the fields "
                            f"are {', '.join(fields)}")
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
            continue
        diff = [(f, getattr(old, f), getattr(policy, f)) for f in fields
                if getattr(old, f) != getattr(policy, f)]
        changes.append(Change("update" if diff else "unchanged", name, diff, policy))
    if problems:
        raise PolicyFileError("\n".join(problems))
    if delete_missing:
        named = {entry["name"] for _, entry in entries}
        changes += [Change("delete", name, policy=p)
                    for name, p in sorted(existing.items()) if name not in named]
    return changes


def apply(changes: list[Change]) -> None:
    """Write the planned changes in one transaction (all or nothing); the policy
    version is published once it commits, as for an edit in the admin."""
    with transaction.atomic():
        for change in changes:
            if change.action in ("create", "update"):
                change.policy.save()
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
