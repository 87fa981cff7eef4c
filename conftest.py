"""pytest's root: the shared fixtures for tests/ and docs/, and the docs' examples as tests.

Every ```python block of README.md and of the pages under docs/ runs, in order, in one
namespace per page
(Sybil). Each block is a test of its own with the suite's fixtures: a clean Redis database,
process state and clock, and the pytest fixtures named below in its namespace. Saving a
policy commits, as in a project (the database is emptied after each block). A block
that cannot run says why in a `<!-- skip: next because ... -->` comment before it.
"""

from typing import Any

from sybil import Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

pytest_plugins = ["tests.support.fixtures"]


def _page_starts(namespace: dict[str, Any]) -> None:
    """Functions a page defines get a `__module__`, as they would in the user's code; the
    limits declared in code so far are noted, to be restored when the page ends."""
    from ratelimits.pipeline.declared import registry

    namespace["__name__"] = "docs_example"
    namespace["_declared_before_the_page"] = dict(registry.declared)


def _page_ends(namespace: dict[str, Any]) -> None:
    """The limits a page declared in code (decorated views, DRF scopes) end with it, and
    so do their policy rows: emptying the database after a block writes the declared
    limits again (Django's flush sends `post_migrate`), and a row left by one page would
    show in the next page's listings."""
    from ratelimits.models import Policy
    from ratelimits.pipeline.declared import registry

    registry.restore(namespace["_declared_before_the_page"])
    with namespace["django_db_blocker"].unblock():
        Policy.objects.filter(declared=True).exclude(name__in=list(registry.declared)).delete()


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["README.md", "docs/*.md", "docs/*/*.md"],
    excludes=["docs/_build/*", "docs/_build/*/*"],
    setup=_page_starts,
    teardown=_page_ends,
    # Sybil asks for these by name, autouse ones included (it does not look them up): Django's
    # test environment, and the suite's Redis and clean process state.
    fixtures=["django_test_environment", "_dj_autoclear_mailbox", "_cache_on_fixture_redis",
              "clean_state", "transactional_db", "client", "rf", "settings", "django_user_model",
              "django_db_blocker"],
).pytest()
