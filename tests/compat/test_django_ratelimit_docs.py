"""docs/migrating/django-ratelimit.md: every deliberate difference it names is a test of
the ported module. (Sybil runs its examples: conftest.py.)"""

import re
from pathlib import Path

from tests.compat import test_django_ratelimit

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migrating" / "django-ratelimit.md"


def test_each_named_difference_is_a_ported_test():
    differences = PAGE.read_text().split("## Deliberate differences", 1)[1]
    named = set(re.findall(r"`(test_\w+)`", differences))
    tests = {name for cls in vars(test_django_ratelimit).values() if isinstance(cls, type)
             for name in vars(cls) if name.startswith("test_")}
    assert named and named <= tests
