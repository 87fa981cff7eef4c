import pytest

from ratelimits.engine import Limit


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "nope"}, "unknown algorithm"),
        ({"limit": 0}, "limit must be a positive integer"),
        ({"limit": -3}, "limit must be a positive integer"),
        ({"period": 0}, "period must be a positive"),
        ({"cost": 0}, "cost must be an integer of at least 1"),
        ({"burst": 5}, "burst applies only to"),
        ({"cost": 11}, "exceeds the capacity"),
        ({"algorithm": "gcra", "burst": 3, "cost": 4}, "exceeds the capacity"),
    ],
)
def test_invalid_limits_are_refused_with_a_clear_message(kwargs, message):
    base = {"key": "k", "algorithm": "fixed_window", "limit": 10, "period": 60}
    with pytest.raises(ValueError, match=message):
        Limit(**{**base, **kwargs})


def test_burst_defaults_to_limit_for_buckets():
    assert Limit("k", "token_bucket", 10, 60).capacity == 10
    assert Limit("k", "gcra", 10, 60, burst=25).capacity == 25
