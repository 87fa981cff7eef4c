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
        ({"max_wait": 1}, "max_wait applies only to token_bucket, leaky_bucket, "
                          "gcra, not to fixed_window"),
        ({"algorithm": "leaky_bucket", "warmup": 30},
         "warmup applies only to token_bucket, gcra, not to leaky_bucket"),
        ({"algorithm": "gcra", "max_wait": -1}, "max_wait must be a number of seconds"),
        ({"algorithm": "gcra", "warmup": float("inf")}, "warmup must be a number"),
        ({"algorithm": "gcra", "warmup": float("nan")}, "warmup must be a number"),
        ({"algorithm": "gcra", "max_wait": "2"}, "max_wait must be a number"),
    ],
)
def test_invalid_limits_are_refused_with_a_clear_message(kwargs, message):
    base = {"key": "k", "algorithm": "fixed_window", "limit": 10, "period": 60}
    with pytest.raises(ValueError, match=message):
        Limit(**{**base, **kwargs})


def test_burst_defaults_to_limit_for_buckets():
    assert Limit("k", "token_bucket", 10, 60).capacity == 10
    assert Limit("k", "gcra", 10, 60, burst=25).capacity == 25
