"""Finding the policy an operator named on the command line."""

from __future__ import annotations

import difflib

from django.core.management.base import CommandError

from ratelimits.models import Policy


def policy_named(name: str) -> Policy:
    """The Policy row called `name`; CommandError naming it and the similar names."""
    policy = Policy.objects.filter(name=name).first()
    if policy is not None:
        return policy
    names = list(Policy.objects.order_by("name").values_list("name", flat=True))
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    if close:
        hint = f"did you mean {', '.join(close)}?"
    elif names:
        shown = ", ".join(names[:10]) + (", …" if len(names) > 10 else "")
        hint = f"the policies are: {shown}"
    else:
        hint = "there are no policies yet"
    raise CommandError(f"no policy named {name!r}; {hint}")
