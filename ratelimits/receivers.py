"""Signal receivers: policy, override and group-member changes reach every process; a
deleted policy's figures go with it; a failed or successful login marks its request for
`charge_on` and `reset_on`. (The slots a DRF throttle holds without the middleware are
freed by receivers of the request signals that `release.release_when_finished` connects
on first use.)"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save
from django.dispatch import receiver
from django.urls import get_resolver

from ratelimits.models import Override, Policy
from ratelimits.ops.reset import forget_figures
from ratelimits.pipeline.changes import Publication, publish
from ratelimits.pipeline.declared import registry
from ratelimits.pipeline.resolver import resolver
from ratelimits.pipeline.settling import mark_signal

logger = logging.getLogger("ratelimits")

#: While set (an admin view runs), each publication's outcome is appended to it: the admin
#: tells the operator when a change was saved but could not be published.
publications: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "ratelimits_publications", default=None
)


def policies_changed(into: Publication | None = None) -> Publication:
    """Tell every process that the policies changed (`changes.publish`: the store's
    version bumped, which each process's listener hears) and rebuild this process's
    snapshot. Returns what became of the publication (also filled into `into`), and
    appends whether it was published to `publications` while an admin view runs."""
    done = publish(into)
    resolver.invalidate(done.version)
    outcomes = publications.get()
    if outcomes is not None:
        outcomes.append(done.published)
    return done


def schedule_policies_changed(using: str | None = None) -> Publication:
    """Publish when the current transaction commits (at once, outside a transaction).

    Waiting for the commit matters: another process that reloads on the new version must
    find the change in the database. The `Publication` returned is filled in then: its
    `done` is True once it was tried, and `published` says whether the store took it.
    """
    publication = Publication()
    transaction.on_commit(functools.partial(policies_changed, publication), using=using)
    return publication


@receiver(post_save, sender=Policy, dispatch_uid="ratelimits.policy_saved")
@receiver(post_delete, sender=Policy, dispatch_uid="ratelimits.policy_deleted")
@receiver(post_save, sender=Override, dispatch_uid="ratelimits.override_saved")
@receiver(post_delete, sender=Override, dispatch_uid="ratelimits.override_deleted")
def _policy_changed(sender: Any, using: str | None = None, **kwargs: Any) -> None:
    schedule_policies_changed(using)


@receiver(post_delete, sender=Policy, dispatch_uid="ratelimits.policy_figures_deleted")
def _policy_deleted(sender: Any, instance: Policy, using: str | None = None,
                    **kwargs: Any) -> None:
    """The figures (counters, offenders) live under the policy's name: forget them once
    the delete commits (after the snapshot stopped counting under it), or a policy
    created later under that name would show the old one's."""
    transaction.on_commit(functools.partial(_forget_figures, instance.name), using=using)


def _forget_figures(name: str) -> None:
    try:
        forget_figures(name)
    except Exception as exc:  # the delete is done: a store outage must not undo the page
        logger.warning("ratelimits: could not delete the figures of deleted policy %r (%s); "
                       "they expire within 25 hours", name, exc)


@receiver(m2m_changed, dispatch_uid="ratelimits.group_members_changed")
def _members_changed(sender: Any, using: str | None = None, **kwargs: Any) -> None:
    """Group overrides follow their groups' members: a user added to or removed from a
    group changes what the snapshot holds (only when some override names a group)."""
    if not str(kwargs.get("action", "")).startswith("post_"):
        return
    if sender is get_user_model().groups.through and Override.objects.filter(
        match__startswith="group:"
    ).exists():
        schedule_policies_changed(using)


@receiver(user_login_failed, dispatch_uid="ratelimits.login_failed")
def _login_failed(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """A policy charging on `login_failed` charges this request (see `settling`)."""
    mark_signal(request, failed=True)


@receiver(user_logged_in, dispatch_uid="ratelimits.logged_in")
def _logged_in(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """A policy resetting on `login` clears this client's count (see `settling`)."""
    mark_signal(request, failed=False)


@receiver(post_migrate, dispatch_uid="ratelimits.write_declared")
def _write_declared(sender: Any, using: str | None = None, **kwargs: Any) -> None:
    """After `migrate`, the limits declared in code are policy rows: the admin lists them
    before the first request. Importing the URLconf imports the decorated views."""
    if getattr(sender, "name", None) != "ratelimits":
        return
    try:
        get_resolver().url_patterns  # noqa: B018  (the import is the point)
    except Exception as exc:  # a broken URLconf is for runserver to report
        logger.warning("ratelimits: could not import the URLconf to find @ratelimit (%s)", exc)
    registry.find()  # the DRF compat throttles of the routed views
    registry.write(force=True)
