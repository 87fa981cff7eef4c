"""Rates as people write them in code: "5/m", "100/10m", "1000/h", "20/s".

The notation of django-ratelimit and of DRF's `THROTTLE_RATES` (whose longer spellings,
"5/min", "100/hour", "2/day", read the same: the first letter of the unit counts), so
limits move over from either unchanged.
"""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([smhd])[a-z]*\s*\Z")


def parse_rate(rate: str) -> tuple[int, int]:
    """`rate` as (limit, period in seconds); ValueError that shows the notation."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None:
        raise ValueError(
            f"rate {rate!r} is not N/<unit> or N/<count><unit>: write e.g. '5/m', "
            "'100/10m', '1000/h' or '20/s' (units s, m, h, d)"
        )
    count, every, unit = match.groups()
    limit, period = int(count), int(every or 1) * _UNITS[unit]
    if limit < 1 or period < 1:
        raise ValueError(f"rate {rate!r} must allow at least 1 request per at least 1 second")
    return limit, period
