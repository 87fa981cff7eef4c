"""The compat layers' tests run as the app's own do: a flushed Redis, no state left over,
and the limits each test declares forgotten after it."""

import pytest

from tests.django.conftest import (  # noqa: F401  (fixtures, found by pytest by name)
    _cache_on_fixture_redis,
    any_store,
    clean_state,
    forget_declarations,
    make_policy,
    memory_store,
)


@pytest.fixture(autouse=True)
def _declarations_end_with_the_test(forget_declarations):  # noqa: F811
    yield
