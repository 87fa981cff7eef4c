"""Request path normalisation and the path patterns policies match against.

A limiter must not be bypassed by spelling the same URL differently, so paths are reduced
to one canonical form before matching. Matching is case-insensitive on purpose: Django's
URLs are case-sensitive, but counting `/API/Login` with `/api/login` errs on the safe side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import unquote

__all__ = ["MAX_PATH_LENGTH", "MAX_PATTERN_LENGTH", "PathPattern", "normalize_path"]

MAX_PATH_LENGTH = 2048
MAX_PATTERN_LENGTH = 255
# Far above any request line a WSGI/ASGI server accepts; bounds the work on absurd input.
_MAX_INPUT = 65536
_DECODE_PASSES = 3

_PERCENT_HEX = re.compile(r"%(?=[0-9A-Fa-f]{2})")
# C0/C1 controls, DEL and lone surrogates: never useful in a path, unsafe in logs.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


#: Paths up to this long are remembered once normalised (a site serves few distinct paths
#: often; a path with an id in it costs one miss).
_CACHED_LENGTH = 256


def normalize_path(path: str) -> str:
    """The canonical form of a request path; never raises, always starts with `/`."""
    if isinstance(path, str) and len(path) <= _CACHED_LENGTH:
        return _normalize_cached(path)
    return _normalize(path)


@lru_cache(maxsize=4_096)
def _normalize_cached(path: str) -> str:
    return _normalize(path)


def _normalize(path: str) -> str:
    text = path[:_MAX_INPUT] if isinstance(path, str) else str(path)[:_MAX_INPUT]
    text = _UNSAFE.sub(_REPLACEMENT, text)
    for _ in range(_DECODE_PASSES):
        if "%" not in text:
            break
        decoded = unquote(text, errors="replace")
        if decoded == text:
            break
        text = decoded
    # Still-encoded after the bounded passes: defuse the '%' so a second normalisation
    # would not decode further (normalize_path must be idempotent).
    text = _PERCENT_HEX.sub(_REPLACEMENT, text)
    text = _UNSAFE.sub(_REPLACEMENT, text).lower()
    result = _canonical(text)
    if len(result) > MAX_PATH_LENGTH:
        # Truncation can leave a trailing slash or a cut "." / ".." segment: tidy again.
        result = _canonical(result[:MAX_PATH_LENGTH])
    return result


def _canonical(text: str) -> str:
    """Separators unified, `;params` dropped, empty and dot segments resolved."""
    segments: list[str] = []
    for raw in text.replace("\\", "/").split("/"):
        segment = raw.split(";", 1)[0]  # "..;x" must still act as ".." (Tomcat-style bypass)
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


# RFC 3986 path characters, minus ';' (parameters are ignored) and '%' handled separately.
_ALLOWED = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@/%]")


@dataclass(frozen=True)
class PathPattern:
    """A path pattern: `""`/`"*"` match all; `*` is one segment, `**` any number of them."""

    pattern: str = field(compare=False)
    canonical: str = field(init=False)
    specificity: int = field(init=False, repr=False)
    _regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _literal: bool = field(init=False, repr=False, compare=False)

    def __init__(self, pattern: str) -> None:
        text = pattern.strip() if isinstance(pattern, str) else pattern
        if not isinstance(text, str):
            raise ValueError(f"path pattern must be text, got {type(pattern).__name__}")
        _validate_text(text)
        canonical = "*" if text in ("", "*") else normalize_path(text)
        segments = [] if canonical in ("*", "/") else canonical[1:].split("/")
        _validate_segments(text, segments)
        literal = canonical == "*" or not any(s in ("*", "**") for s in segments)
        set_ = object.__setattr__
        set_(self, "pattern", text)
        set_(self, "canonical", canonical)
        set_(self, "specificity", _specificity(canonical, segments))
        set_(self, "_literal", literal)
        set_(self, "_regex", None if literal else re.compile(_regex_for(segments)))

    @property
    def matches_all(self) -> bool:
        """True for `""`, `"*"` and `/**`: every path matches."""
        return self.canonical in ("*", "/**")

    def matches(self, normalized_path: str) -> bool:
        """Whether a path already passed through `normalize_path` matches."""
        if self.canonical == "*":
            return True
        if self._literal:
            return normalized_path == self.canonical
        assert self._regex is not None
        # The root is "/" but has no segments: match it as the empty string.
        target = "" if normalized_path == "/" else normalized_path
        return self._regex.fullmatch(target) is not None


def _validate_text(text: str) -> None:
    if len(text) > MAX_PATTERN_LENGTH:
        raise ValueError(
            f"path pattern is {len(text)} characters; shorten it to {MAX_PATTERN_LENGTH} or "
            "fewer (use '**' for a long tail)"
        )
    if text in ("", "*"):
        return
    if any(c.isspace() for c in text):
        raise ValueError(f"path pattern {text!r} contains whitespace; remove it")
    if not text.startswith("/"):
        raise ValueError(
            f"path pattern {text!r} must start with '/', e.g. '/api/login/' (or be '*' for all)"
        )
    for char in text:
        if char == "?":
            raise ValueError(f"path pattern {text!r} has a query string; remove '?' and after")
        if char == ";":
            raise ValueError(
                f"path pattern {text!r} has ';' parameters, which matching ignores; remove them"
            )
        if char == "\\":
            raise ValueError(f"path pattern {text!r} contains '\\'; use '/' between segments")
        if not (_ALLOWED.match(char) or (ord(char) > 0x9F and char.isprintable())):
            raise ValueError(
                f"path pattern {text!r} contains {char!r}, which is not allowed in a path; "
                "use letters, digits and - . _ ~ ! $ & ' ( ) * + , = : @ / or %XX"
            )


def _validate_segments(text: str, segments: list[str]) -> None:
    for segment in segments:
        if segment in ("*", "**"):
            continue
        if set(segment) == {"*"}:
            raise ValueError(
                f"path pattern {text!r} has {segment!r}; use '*' for one segment "
                "or '**' for any number of segments"
            )
        if "*" in segment:
            raise ValueError(
                f"path pattern {text!r} has '*' inside the segment {segment!r}; a wildcard "
                "must be a whole segment, e.g. '/api/*/items/'"
            )
    if sum(1 for s in segments if s == "**") > 1:
        raise ValueError(f"path pattern {text!r} uses '**' more than once; keep only one")


def _regex_for(segments: list[str]) -> str:
    parts = []
    for segment in segments:
        if segment == "*":
            parts.append("/[^/]+")
        elif segment == "**":
            parts.append("(?:/[^/]+)*")
        else:
            parts.append("/" + re.escape(segment))
    return "".join(parts)


def _specificity(canonical: str, segments: list[str]) -> int:
    """Literal segments, then single wildcards, then "anchored" (no `**`), as base-256 digits."""
    if canonical == "*":
        return 0
    literal = sum(1 for s in segments if s not in ("*", "**"))
    single = segments.count("*")
    anchored = 0 if "**" in segments else 1
    return literal * 65536 + single * 256 + anchored
