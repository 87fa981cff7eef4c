"""The model speaks of the algorithms as the engine's registry declares them."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from ratelimits.engine.registry import REGISTRY
from ratelimits.models import ALGORITHM_CHOICES, Policy


def test_the_choices_are_the_registry():
    assert [(n, s.label) for n, s in REGISTRY.items()] == ALGORITHM_CHOICES
    assert Policy._meta.get_field("algorithm").choices == ALGORITHM_CHOICES


@pytest.mark.django_db  # makemigrations reads the applied migrations to check their history
def test_a_new_algorithm_needs_no_migration():
    """The choices come from the registry when the model loads and stay out of the
    migrations (which are in step with the models: makemigrations finds nothing)."""
    _, _, _, kwargs = Policy._meta.get_field("algorithm").deconstruct()
    assert "choices" not in kwargs
    call_command("makemigrations", "ratelimits", check=True, dry_run=True, verbosity=0)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_burst_and_wording_follow_the_entry(name):
    spec = REGISTRY[name]
    # 5 per second: a queue of 3 drains within MAX_DELAY
    policy = Policy(name="p", algorithm=name, limit=5, period=1, burst=3, key="ip")
    if spec.has_burst:
        policy.clean()
        assert f", {'queue' if spec.delays else 'burst'} 3" in policy.human_rate()
    else:
        with pytest.raises(ValidationError, match="has no burst"):
            policy.clean()
    policy.burst = None
    expected = "1 to 5 at a time" if spec.learned else "5 at a time" if spec.holds_slots else \
        "5 per second"
    assert policy.human_rate().startswith(expected)
