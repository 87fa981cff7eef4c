"""`RatelimitMiddleware`: answers `Ratelimited` with the view `settings.RATELIMIT_VIEW`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from ratelimits.compat.django_ratelimit.exceptions import Ratelimited

__all__ = ["RatelimitMiddleware"]


class RatelimitMiddleware:
    """Turns a `Ratelimited` raised by a view into `RATELIMIT_VIEW(request, exception)`."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_exception(self, request: Any, exception: Exception) -> Any:
        if not isinstance(exception, Ratelimited):
            return None
        view = import_string(getattr(settings, "RATELIMIT_VIEW"))  # noqa: B009  (no stub)
        return view(request, exception)
