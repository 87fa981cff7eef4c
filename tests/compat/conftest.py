"""The compat layers' tests run as the app's own do: a flushed Redis, no state left over."""

import pytest

from ratelimits.pipeline.declared import registry
from tests.django.conftest import (  # noqa: F401  (fixtures, found by pytest by name)
    _cache_on_fixture_redis,
    any_store,
    clean_state,
    make_policy,
    memory_store,
)


@pytest.fixture(autouse=True)
def _forget_declarations():
    """The limits a test declares (its decorated views, its throttles' scopes) end with
    it: later tests compile their snapshots without them."""
    before = dict(registry.declared)
    yield
    registry.declared.clear()
    registry.declared.update(before)
    registry.generation += 1
    registry.forget_written()
