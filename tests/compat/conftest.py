"""The compat layers' tests run as the app's own do (tests/support/fixtures.py: a flushed Redis, no
state left over), and the limits each test declares are forgotten after it."""

import pytest


@pytest.fixture(autouse=True)
def _declarations_end_with_the_test(forget_declarations):
    yield
