"""The compat layers' tests run as the app's own do: a flushed Redis, no state left over."""

from tests.django.conftest import (  # noqa: F401  (fixtures, found by pytest by name)
    _cache_on_fixture_redis,
    any_store,
    clean_state,
    make_policy,
    memory_store,
)
