"""What the admin says about the store: whether a change it saved was published to the
other processes (`publication_reported`), and the banner of every rate-limit page while
the store does not answer (`StoreBanner`, for pages that read no figures of their own;
the policy pages' banners come with their figures, see `ratelimits.ops.dashboard`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import messages
from django.db import transaction

from ratelimits import receivers
from ratelimits.ops import dashboard
from ratelimits.pipeline.resolver import DB_CHECK_EVERY

#: What a change saved while the store did not answer means (after what was saved).
UNPUBLISHED = (
    "{saved}, but could not be published: the store did not answer, so the other "
    "processes were not told. Each finds the change when it next reads the policy table, "
    "within {every:g} seconds of its next request; until the store answers, every policy "
    "falls back to its on_error."
)


class _Publication:
    """Whether the changes a view saves were published, collected at their commit; then
    the operator is told `done`, or what was `saved` and that it could not be published."""

    def __init__(self, model_admin: Any, request: Any, done: str | None, saved: str) -> None:
        self.model_admin, self.request, self.done, self.saved = model_admin, request, done, saved
        self.outcomes: list[bool] = []
        self.token: Any = None

    def start(self) -> None:
        self.token = receivers.publications.set(self.outcomes)

    def end(self) -> None:
        if self.token is not None:
            receivers.publications.reset(self.token)
        if False in self.outcomes:
            self.model_admin.message_user(self.request, UNPUBLISHED.format(
                saved=self.saved, every=DB_CHECK_EVERY), messages.WARNING)
        elif self.done is not None:
            self.model_admin.message_user(self.request, self.done, messages.SUCCESS)


@contextmanager
def publication_reported(model_admin: Any, request: Any, done: str | None = None,
                         saved: str = "The change was saved") -> Iterator[None]:
    """Around the writes of an admin view: once they commit, with the publications they
    scheduled (which run at the commit, in order), say `done` (when given), or that what
    was `saved` could not be published. Works inside a request-wide transaction too."""
    publication = _Publication(model_admin, request, done, saved)
    transaction.on_commit(publication.start)
    try:
        yield
    finally:
        transaction.on_commit(publication.end)


class StoreBanner:
    """A ModelAdmin mixin: its list and form pages show the store's banner (one read of
    the policy version tells whether the store answers), and its saves and deletes say
    when a change could not be published."""

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        extra = {"store_notice": dashboard.probe_store(), **(extra_context or {})}
        with publication_reported(self, request):
            return super().changelist_view(request, extra)  # type: ignore[misc]

    def changeform_view(self, request: Any, object_id: str | None = None, form_url: str = "",
                        extra_context: Any = None) -> Any:
        extra = {"store_notice": dashboard.probe_store(), **(extra_context or {})}
        with publication_reported(self, request):
            return super().changeform_view(  # type: ignore[misc]
                request, object_id, form_url, extra)

    def delete_view(self, request: Any, object_id: str, extra_context: Any = None) -> Any:
        with publication_reported(self, request):
            return super().delete_view(request, object_id, extra_context)  # type: ignore[misc]
