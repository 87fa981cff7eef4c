"""docs/migrating-from-django-ratelimit.md: every python example runs as written, and
every deliberate difference it names is a test of the ported module."""

import re
from pathlib import Path

import pytest

from tests.compat import test_django_ratelimit

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-django-ratelimit.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)

pytestmark = pytest.mark.django_db



def test_the_page_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_each_example_runs(number):
    code = compile(BLOCKS[number], f"{PAGE.name}[python block {number}]", "exec")
    exec(code, {"__name__": f"docs_example_{number}"})


def test_each_named_difference_is_a_ported_test():
    differences = PAGE.read_text().split("## Deliberate differences", 1)[1]
    named = set(re.findall(r"`(test_\w+)`", differences))
    tests = {name for cls in vars(test_django_ratelimit).values() if isinstance(cls, type)
             for name in vars(cls) if name.startswith("test_")}
    assert named and named <= tests
