"""Every `TIER` function the documentation shows ignores what the client sends (issue 29,
#12).

A tier decides how much a client may do, so a function that reads it from a header, a
parameter or a cookie lets any client pick the most generous one, and readers copy the
examples. Each page that sets `RATELIMITS["TIER"]` has its function run here on a
request whose every header, parameter and cookie asks for the best tier: it must name
the same tier as for the same user asking for nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_SETTING = re.compile(r"""["']TIER["']\s*:\s*f?["']([\w.{}]+)["']""")
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
CHOSEN = "enterprise"


class EveryName(dict[str, Any]):
    """A request's headers, parameters or cookies at their most hostile: every name a
    function may look up is there, with the value the client would choose."""

    def __missing__(self, key: str) -> str:
        return CHOSEN

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]

    def getlist(self, key: str, default: Any = None) -> list[str]:
        return [CHOSEN]


def documented_tiers() -> list[tuple[str, str]]:
    """(page, source of the block that defines its TIER function), for every page that
    names one."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for dotted in _SETTING.findall(text):
            name = dotted.rsplit(".", 1)[-1]
            blocks = [b for b in _BLOCK.findall(text) if re.search(rf"def {name}\(", b)]
            assert blocks, f"{page.relative_to(ROOT)} sets TIER to {dotted} but defines no {name}()"
            found.append((f"{page.relative_to(ROOT)}:{name}", blocks[0]))
    return found


TIERS = documented_tiers()


def test_the_pages_that_show_a_tier_function_are_all_found():
    pages = {where.split(":")[0] for where, _ in TIERS}
    assert {"docs/settings.md", "docs/security.md", "docs/concepts/policies.md",
            "docs/recipes/api-plans.md"} <= pages


def _tier_function(where: str, source: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(source, where, "exec"), namespace)
    return namespace[where.rsplit(":", 1)[1]]


def _requests(rf: Any, user: Any) -> tuple[Any, Any]:
    """The same user's request asking for nothing, and asking for the best tier in every
    header, query and form parameter and cookie."""
    plain = rf.get("/api/items/")
    forged = rf.post(f"/api/items/?plan={CHOSEN}&tier={CHOSEN}",
                     {"plan": CHOSEN, "tier": CHOSEN}, HTTP_X_PLAN=CHOSEN,
                     HTTP_X_TIER=CHOSEN)
    forged.META = EveryName(forged.META)
    forged.__dict__["headers"] = EveryName()
    forged.GET, forged.POST, forged.COOKIES = EveryName(), EveryName(), EveryName()
    plain.user = forged.user = user
    return plain, forged


@pytest.mark.parametrize(("where", "source"), TIERS, ids=[where for where, _ in TIERS])
def test_a_documented_tier_function_cannot_be_told_the_tier_by_the_client(
    where, source, rf, django_user_model
):
    tier = _tier_function(where, source)
    signed_in = django_user_model.objects.create_user("free-customer")
    for user in (AnonymousUser(), signed_in):
        plain, forged = _requests(rf, user)
        assert tier(forged) == tier(plain), (where, user)
