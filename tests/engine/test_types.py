import pytest

from ratelimits.engine import Limit


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "nope"}, "unknown algorithm"),
        ({"limit": 0}, "limit must be a positive integer"),
        ({"limit": -3}, "limit must be a positive integer"),
        ({"period": 0}, "period must be a positive"),
        ({"cost": -1}, "cost must be an integer of at least 1"),
        # cost 0 is a read, for a plain count only (PEEKABLE_ALGORITHMS)
        ({"algorithm": "sliding_window", "cost": 0}, "cost 0, a read, applies only to"),
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


def test_cost_zero_reads_a_fixed_window_without_taking(engine):
    """django-ratelimit's `increment=False`: a read of what is left, nothing charged."""
    limit = Limit("k", "fixed_window", 2, 60)
    read = Limit("k", "fixed_window", 2, 60, cost=0)
    assert engine.evaluate([read], now=1000.0).results[0].remaining == 2
    assert engine.evaluate([limit], now=1000.0).allowed
    assert engine.evaluate([read], now=1000.0).results[0].remaining == 1
    assert engine.evaluate([limit], now=1000.0).allowed
    full = engine.evaluate([read], now=1000.0).results[0]
    assert full.allowed and full.remaining == 0  # the next request would be refused
    assert not engine.evaluate([limit], now=1000.0).allowed
