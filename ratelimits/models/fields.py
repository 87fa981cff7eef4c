"""The vocabulary of a policy's columns: the choices of its modes, counting and outage
answer, and the fields whose choices and help text come from the registries."""

from __future__ import annotations

from typing import Any

from django.db import models

from ratelimits.engine.registry import REGISTRY
from ratelimits.matching.keykinds import KEY_KINDS

#: Where migrations find these fields: the package names them, wherever they are defined,
#: so moving a field between its modules writes no migration.
_PUBLIC_MODULE = "ratelimits.models"


class Mode(models.TextChoices):
    ENFORCE = "enforce", "enforce"
    SHADOW = "shadow", "shadow (log only)"
    OFF = "off", "off"


class Counting(models.TextChoices):
    SHARED = "shared", "shared by every process (the store)"
    PER_PROCESS = "per_process", "per process (no store call)"


class OnError(models.TextChoices):
    ALLOW = "allow", "allow the request"
    DENY = "deny", "deny with 503"
    LOCAL = "local", "decide in this process"


ALGORITHM_CHOICES = [(entry.name, entry.label) for entry in REGISTRY.values()]


class KeyField(models.CharField):  # type: ignore[type-arg]
    """A policy's `key`: its form lists the key kinds declared now (`KEY_KINDS`), so a
    new kind shows in the admin without a migration for the field's help text."""

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{**kwargs, "help_text": KEY_KINDS.help_text()})

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, f"{_PUBLIC_MODULE}.KeyField", args, kwargs


class AlgorithmField(models.CharField):  # type: ignore[type-arg]
    """A policy's `algorithm`, one of the registry's (`engine.registry.REGISTRY`): the
    choices are read from it when the model loads and are not written into migrations,
    so a new algorithm is its registry entry, with no migration for the field."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["choices"] = ALGORITHM_CHOICES
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        kwargs.pop("choices", None)
        return name, f"{_PUBLIC_MODULE}.AlgorithmField", args, kwargs
