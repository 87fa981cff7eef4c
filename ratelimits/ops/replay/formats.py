"""Reading access logs: files (plain or gzip), their formats and their timestamps.

Formats: Combined / Common Log Format, and JSON lines (see `JSON_KEYS`). A parser turns a
line into `(ip, user, stamp, method, path, query, status)` (user "-" or None: anonymous;
query None: no "?" in the target; status the response's, as text, or "-" or None when
the line has none); the stamp is converted to epoch seconds by the format's own
function, separately, so a replay converts each distinct stamp once. Each format also has
a `fast` match for its common lines, whose groups are that same tuple; a line it does
not match goes through the parser, which handles every case.
"""

from __future__ import annotations

import calendar
import datetime
import gzip
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

FORMATS = ("combined", "json")
#: JSON-lines field names, first present wins.
JSON_KEYS = {
    "time": ("time", "timestamp", "@timestamp"),
    "ip": ("ip", "client_ip", "remote_addr"),
    "method": ("method", "request_method"),
    "path": ("path", "uri", "request_uri", "url"),
    "user": ("user", "remote_user"),
    "status": ("status", "status_code", "response_status"),
}

_CLF = re.compile(
    r'(\S+) \S+ (\S+) \[([^\]]*)\] "([^"\\]*(?:\\.[^"\\]*)*)" (\d{3}|-) (?:\d+|-)(?:\s|$)'
)
# The common line: a plain "METHOD target PROTOCOL" request (no quotes, backslashes or
# spaces inside its parts), split here into path and query. Whatever it matches, the
# full parser would split the same way.
_CLF_FAST = re.compile(
    r'(\S+) \S+ (\S+) \[([^\]]*)\] "([^\s"\\]+) ([^\s"\\?]+)(?:\?([^\s"\\]*))?'
    r'(?: [^\s"\\]+)?" (\d{3}|-) (?:\d+|-)(?:\s|$)'
)
_CLF_TIME = re.compile(
    r"(\d{1,2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2})(\.\d+)? ([+-])(\d{2}):?(\d{2})"
)
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}

#: ip, user, stamp, method, path, query, status
Parsed = tuple["str | None", "str | None", Any, str, str, "str | None", "str | None"]


class LogError(ValueError):
    """A line of the log could not be read; the message names the file and line."""


class BadLine(Exception):
    """One malformed line (the message says what is wrong)."""


@contextmanager
def open_log(path: str) -> Iterator[tuple[IO[str], Callable[[], int], int | None]]:
    """The log as text lines (gzip detected by its magic bytes), a function returning how
    many bytes of the file were read so far, and the file size ("-": stdin, no size)."""
    raw: Any = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        size = None if path == "-" else os.fstat(raw.fileno()).st_size
        binary = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline="")

        def position() -> int:
            try:
                return int(raw.tell())
            except OSError:  # a pipe
                return 0

        yield text, position, size
    finally:
        if path != "-":
            raw.close()


def detect_format(line: str) -> str:
    return "json" if line.lstrip().startswith("{") else "combined"


def parse_combined(line: str) -> Parsed:
    m = _CLF.match(line)
    if m is None:
        raise BadLine("not a combined-log line")
    ip, user, stamp, request, status = m.groups()
    parts = request.split(" ")
    if len(parts) not in (2, 3):
        # "-", a TLS probe ... not a request Django sees
        return ip, None, stamp, "", "", None, status
    return (ip, user, stamp, parts[0], *split_target(parts[1]), status)


def split_target(target: str) -> tuple[str, str | None]:
    """`/a?b=1` -> (`/a`, `b=1`); no "?": (`/a`, None)."""
    path, sep, query = target.partition("?")
    return path, query if sep else None


def clf_time(stamp: Any) -> float:
    m = _CLF_TIME.fullmatch(stamp)
    month = _MONTHS.get(m.group(2).lower()) if m else None
    if m is None or month is None:
        raise BadLine(f"bad timestamp [{stamp}], expected e.g. [10/Oct/2000:13:55:36 -0700]")
    day, _, year, hh, mm, ss, frac, sign, oh, om = m.groups()
    try:
        t = calendar.timegm((int(year), month, int(day), int(hh), int(mm), int(ss)))
    except ValueError as exc:
        raise BadLine(f"bad timestamp [{stamp}]: {exc}") from None
    offset = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return t - offset + (float(frac) if frac else 0)


def _first(obj: dict[str, Any], what: str) -> Any:
    for key in JSON_KEYS[what]:
        value = obj.get(key)
        if value is not None:
            return value
    return None


def parse_json(line: str) -> Parsed:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise BadLine(f"not a JSON line ({exc})") from None
    if not isinstance(obj, dict):
        raise BadLine("not a JSON object")
    stamp, method, path = _first(obj, "time"), _first(obj, "method"), _first(obj, "path")
    for what, value in (("time", stamp), ("method", method), ("path", path)):
        if value is None or value == "":
            raise BadLine(f"no {what} (keys {', '.join(JSON_KEYS[what])})")
    if isinstance(stamp, bool) or not isinstance(stamp, (str, int, float)):
        raise BadLine(f"time {stamp!r} is neither an ISO 8601 string nor epoch seconds")
    ip, user = _first(obj, "ip"), _first(obj, "user")
    user = None if user in (None, "", "-") else str(user)
    ip = None if ip is None else str(ip)
    status = _first(obj, "status")
    status = None if status is None or isinstance(status, bool) else str(status)
    return (ip, user, stamp, str(method), *split_target(str(path)), status)


def json_time(stamp: Any) -> float:
    if isinstance(stamp, (int, float)):
        return float(stamp)
    try:
        return float(stamp)  # epoch seconds written as a string
    except ValueError:
        pass
    text = stamp.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadLine(f"time {stamp!r} is not ISO 8601 (e.g. 2024-05-01T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)  # naive: taken as UTC
    return moment.timestamp()


_NEVER = re.compile(r"(?!)")

#: Each format's fast match, line parser and timestamp converter.
PARSERS: dict[
    str, tuple[Callable[[str], Any], Callable[[str], Parsed], Callable[[Any], float]]
] = {
    "combined": (_CLF_FAST.match, parse_combined, clf_time),
    "json": (_NEVER.match, parse_json, json_time),
}
