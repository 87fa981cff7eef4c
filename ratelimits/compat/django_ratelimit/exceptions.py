"""The exception a `block=True` limit raises: a 403 unless `RATELIMIT_VIEW` answers it."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied

__all__ = ["Ratelimited"]


class Ratelimited(PermissionDenied):
    """A request refused by a django-ratelimit style limit (Django answers 403)."""
