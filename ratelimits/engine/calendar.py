"""Calendar windows: a day, a week or a month of a time zone, as a fixed window's window.

Plans are sold as "500 a day" and "10,000 a month", reset at local midnight and on the
1st, not every 86,400 or 2,592,000 seconds from 1970. A calendar window starts at local
midnight (of a Monday for a week, of the 1st for a month) and lasts until the next one:
23 or 25 hours on a day the clocks change, 28 to 31 days for a month.

Both backends key a window by its start in whole seconds, so they share its count. The
in-process engine finds the window of its `now`; a Redis call carries the windows around
the caller's clock (`bounds`) and the script picks the one holding the server's time, so
processes with slightly skewed clocks still agree at a boundary.
"""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["CALENDARS", "NOMINAL_SECONDS", "bounds", "check_zone", "window"]

#: The calendar windows, and their nominal length (what "per day" shows; the windows
#: themselves are as long as the calendar makes them).
NOMINAL_SECONDS: dict[str, int] = {"day": 86_400, "week": 7 * 86_400, "month": 30 * 86_400}
CALENDARS: tuple[str, ...] = tuple(NOMINAL_SECONDS)

_US = 1_000_000


def check_zone(name: str) -> ZoneInfo:
    """The zone called `name`, or a ValueError that says what to fix."""
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as "
                         f"'Europe/Paris' or 'UTC')") from exc


@lru_cache(maxsize=64)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _start_of(kind: str, local: dt.datetime) -> dt.date:
    day = local.date()
    if kind == "day":
        return day
    if kind == "week":
        return day - dt.timedelta(days=day.weekday())
    if kind == "month":
        return day.replace(day=1)
    raise ValueError(f"unknown calendar {kind!r}; choose one of {', '.join(CALENDARS)}")


def _after(kind: str, start: dt.date) -> dt.date:
    if kind == "day":
        return start + dt.timedelta(days=1)
    if kind == "week":
        return start + dt.timedelta(days=7)
    return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


def _midnight(day: dt.date, zone: ZoneInfo) -> int:
    """The instant (whole seconds) the local day begins. Where a zone skips midnight
    (a few change their clocks at 00:00), the day begins when the clocks jump: the
    earlier offset (fold 0) reads a missing 00:00 as that instant, and a repeated one as
    its first occurrence."""
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=zone).timestamp())


@lru_cache(maxsize=256)
def _window_of_day(kind: str, zone_name: str, day: dt.date) -> tuple[int, int]:
    zone = _zone(zone_name)
    start = _start_of(kind, dt.datetime(day.year, day.month, day.day))
    return _midnight(start, zone), _midnight(_after(kind, start), zone)


def window(kind: str, zone: str, at: float) -> tuple[int, int]:
    """(start, end) in whole seconds of the `kind` window of `zone` holding `at`
    (seconds since the epoch)."""
    local = dt.datetime.fromtimestamp(at, _zone(zone))
    start, end = _window_of_day(kind, zone, local.date())
    if at < start:  # a day that began late (a skipped midnight): still yesterday's window
        start, end = _window_of_day(kind, zone, local.date() - dt.timedelta(days=1))
    return start, end


def bounds(kind: str, zone: str, now_us: int) -> tuple[int, int, int]:
    """The window holding `now_us` and the next one, as three boundaries in µs: the
    current window is [first, second), the next [second, third)."""
    start, end = window(kind, zone, now_us / _US)
    _, after = window(kind, zone, end)
    return start * _US, end * _US, after * _US
