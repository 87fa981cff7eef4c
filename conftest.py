"""pytest's root: the shared fixtures for tests/ and docs/, and the docs' examples as tests.

Every ```python block of a page under docs/ runs, in order, in one namespace per page
(Sybil). Each block is a test of its own with the suite's fixtures: a clean Redis database,
process state and clock, and the pytest fixtures named below in its namespace. A block
that cannot run says why in a `<!-- skip: next because ... -->` comment before it.
"""

from sybil import Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

pytest_plugins = ["tests.support.fixtures"]


def _as_a_module(namespace: dict[str, object]) -> None:
    """Functions a page defines get a `__module__`, as they would in the user's code."""
    namespace["__name__"] = "docs_example"


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    path="docs",
    patterns=["*.md"],
    excludes=["_build/*"],
    setup=_as_a_module,
    # Sybil asks for these by name, autouse ones included (it does not look them up): Django's
    # test environment, and the suite's Redis and clean process state.
    fixtures=["django_test_environment", "_dj_autoclear_mailbox", "_cache_on_fixture_redis",
              "clean_state", "db", "client", "rf", "settings", "django_user_model"],
).pytest()
