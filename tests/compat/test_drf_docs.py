"""docs/migrating/drf.md: every deliberate difference it names is a test of the ported
module (or of test_drf_compat). (Sybil runs its examples: conftest.py.)"""

import re
from pathlib import Path

from tests.compat import test_drf_compat, test_drf_throttling

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migrating" / "drf.md"


def test_each_named_difference_is_a_commented_test():
    import inspect

    differences = PAGE.read_text().split("## Deliberate differences", 1)[1]
    named = set(re.findall(r"`(test_\w+)`", differences))
    tests = {name: obj for module in (test_drf_throttling, test_drf_compat)
             for name, obj in _tests(module)}
    assert named and named <= set(tests)
    for name in named:
        assert "DIFFERENCE" in inspect.getsource(tests[name]), name


def _tests(module):
    for name, obj in vars(module).items():
        if name.startswith("test_"):
            yield name, obj
        elif isinstance(obj, type):
            yield from ((n, f) for n, f in vars(obj).items() if n.startswith("test_"))
