"""Path normalisation (no bypass by spelling) and path patterns."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ratelimits.matching.paths import MAX_PATH_LENGTH, PathPattern, normalize_path

LOGIN = "/api/login"

BYPASS_VARIANTS = [
    "/api/login/",
    "/api/login",
    "//api/login/",
    "/api//login/",
    "///api///login///",
    "/api/./login/",
    "/./api/login/.",
    "/api/x/../login/",
    "/api/x/y/../../login/",
    "/API/Login/",
    "/api/%6cogin/",
    "/api/%6Cogin/",
    "/api/%256cogin/",
    "/api%2flogin",
    "/api/login;jsessionid=1",
    "/api;x=1/login/",
    "/api/x/..;/login",
    "\\api\\login",
    "/api\\login\\",
    "/api/%5clogin",
    "/../api/login/",
    "/../../../api/login",
    "api/login",
]


@pytest.mark.parametrize("variant", BYPASS_VARIANTS)
def test_bypass_variants_normalise_to_the_same_path(variant: str) -> None:
    assert normalize_path(variant) == LOGIN
    assert PathPattern("/api/login/").matches(normalize_path(variant))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", "/"),
        ("/", "/"),
        ("//", "/"),
        ("/..", "/"),
        ("/%2e%2e/", "/"),
        ("/a\x00b", "/a\ufffdb"),
        ("/a%00b", "/a\ufffdb"),
        ("/a\ud800b", "/a\ufffdb"),
        ("/%ff", "/\ufffd"),
        ("/caf%C3%A9", "/café"),
        ("/a+b", "/a+b"),
        ("/100%", "/100%"),
    ],
)
def test_normalise_edge_cases(raw: str, expected: str) -> None:
    assert normalize_path(raw) == expected


def test_decoding_is_bounded_and_leaves_no_escape_behind() -> None:
    deep = "/%2525252541"  # four levels of encoding: more than we decode
    result = normalize_path(deep)
    assert "%" not in result
    assert normalize_path(result) == result


def test_huge_paths_are_capped() -> None:
    result = normalize_path("/" + "a/" * 1_000_000)
    assert len(result) <= MAX_PATH_LENGTH
    assert not result.endswith("/")
    assert normalize_path(result) == result


def test_dot_segments_after_truncation_are_resolved() -> None:
    # The cut lands right after "..": the truncated result must still be canonical.
    path = "/" + "a" * (MAX_PATH_LENGTH - 4) + "/..bbbbbb"
    result = normalize_path(path)
    assert normalize_path(result) == result


@pytest.mark.parametrize(
    ("pattern", "path", "matched"),
    [
        ("", "/anything/at/all", True),
        ("*", "/", True),
        ("*", "/x", True),
        ("/", "/", True),
        ("/", "/x", False),
        ("/api/login/", "/api/login", True),
        ("/api/login", "/api/login", True),
        ("/API/Login/", "/api/login", True),
        ("/api/login/", "/api/login/extra", False),
        ("/api/login/", "/api", False),
        ("/api/*/items/", "/api/v1/items", True),
        ("/api/*/items/", "/api/items", False),
        ("/api/*/items/", "/api/v1/v2/items", False),
        ("/api/v1/users/*/", "/api/v1/users/42", True),
        ("/api/v1/users/*/", "/api/v1/users", False),
        ("/api/v1/users/*/", "/api/v1/users/42/posts", False),
        ("/static/**", "/static", True),
        ("/static/**", "/static/css/site.css", True),
        ("/static/**", "/staticfiles/x", False),
        ("/static/**", "/", False),
        ("/**", "/", True),
        ("/**", "/a/b/c", True),
        ("/api/**/export/", "/api/export", True),
        ("/api/**/export/", "/api/a/b/export", True),
        ("/api/**/export/", "/api/a/b/export/x", False),
        ("/a.b/", "/a.b", True),
        ("/a.b/", "/axb", False),  # literal '.' is not a regex dot
        ("/api/*/", "/api/a.b", True),
    ],
)
def test_pattern_matching(pattern: str, path: str, matched: bool) -> None:
    assert PathPattern(pattern).matches(normalize_path(path)) is matched


def test_pattern_keeps_the_text_as_given_and_compares_by_meaning() -> None:
    pattern = PathPattern("  /API/Login/ ")
    assert pattern.pattern == "/API/Login/"
    assert pattern == PathPattern("/api/login")
    assert hash(pattern) == hash(PathPattern("/api/login"))
    assert pattern != PathPattern("/api/logout")
    assert "/API/Login/" in repr(pattern)
    assert PathPattern("") == PathPattern("*")


def test_pattern_is_immutable() -> None:
    pattern = PathPattern("/api/")
    with pytest.raises(AttributeError):
        pattern.pattern = "/other/"  # type: ignore[misc]


def test_specificity_orders_patterns_from_most_to_least_specific() -> None:
    ordered = [
        "/api/v1/users/*/",
        "/api/v1/users/",
        "/api/v1/**",
        "/api/*/",
        "/api/**",
        "/",
        "*",
    ]
    scores = [PathPattern(p).specificity for p in ordered]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) == len(scores)
    assert PathPattern("").specificity == PathPattern("*").specificity == 0


@pytest.mark.parametrize(
    ("pattern", "hint"),
    [
        ("api/login/", "must start with '/'"),
        ("/api/v*/items/", "must be a whole segment"),
        ("/api/*x/", "must be a whole segment"),
        ("/api/***/", "use '*' for one segment"),
        ("/api/ login/", "whitespace"),
        ("/api/\tlogin/", "whitespace"),
        ("/api/<id>/", "not allowed in a path"),
        ("/api/{id}/", "not allowed in a path"),
        ('/api/"x"/', "not allowed in a path"),
        ("/api/\x00/", "not allowed in a path"),
        ("/api/login?next=/", "query string"),
        ("/api/login;x=1", "';' parameters"),
        ("/api\\login", "use '/'"),
        ("/" + "a" * 255, "shorten it to 255"),
        ("/**/a/**", "more than once"),
    ],
)
def test_bad_patterns_say_what_to_fix(pattern: str, hint: str) -> None:
    with pytest.raises(ValueError, match="path pattern") as info:
        PathPattern(pattern)
    assert hint in str(info.value)


@given(st.text(max_size=300))
def test_normalize_path_never_raises_and_is_idempotent(text: str) -> None:
    result = normalize_path(text)
    assert result.startswith("/")
    assert len(result) <= MAX_PATH_LENGTH
    assert normalize_path(result) == result


@given(st.text(alphabet="/.%;\\aA*2e5cf", max_size=60))
def test_normalize_path_idempotent_on_tricky_alphabet(text: str) -> None:
    result = normalize_path(text)
    assert normalize_path(result) == result
    assert "//" not in result
    assert result == "/" or not result.endswith("/")


def segments_match(pattern: str, path: str) -> bool:
    """What each pattern below must match, worked out on the normalised path's segments."""
    segments = [] if path == "/" else path[1:].split("/")
    return {
        "*": True,
        "/": segments == [],
        "/api/login/": segments == ["api", "login"],
        "/static/**": segments[:1] == ["static"],
        "/api/*/items/": len(segments) == 3 and segments[::2] == ["api", "items"],
        "/api/**/export/": len(segments) >= 2 and segments[0] == "api" and segments[-1] == "export",
    }[pattern]


PATTERNS = ["*", "/", "/api/login/", "/static/**", "/api/*/items/", "/api/**/export/"]
# Paths built from the pieces the patterns name, so that matches are common, not luck.
pieces = st.sampled_from(
    ["api", "API", "login", "static", "items", "export", "x"]
) | st.sampled_from([".", "..", "", "%2e", ";p=1", "staticx"])
near_paths = st.lists(pieces, max_size=6).map("/".join) | st.text(max_size=40)


@settings(max_examples=500)
@given(st.sampled_from(PATTERNS), near_paths)
@example("/api/*/items/", "/api/v1/x/items")
@example("/api/*/items/", "/api//items")
@example("/static/**", "/staticx/a")
@example("/api/**/export/", "/api/export/x")
@example("/", "/x/..")
def test_matches_agrees_with_the_segment_rules(pattern: str, text: str) -> None:
    path = normalize_path(text)
    assert PathPattern(pattern).matches(path) is segments_match(pattern, path)


@given(st.sampled_from(PATTERNS), st.text())
def test_matches_on_a_raw_path_never_raises_and_answers_a_bool(pattern: str, text: str) -> None:
    # matches() wants a normalised path; given anything else it must still answer, not raise.
    assert type(PathPattern(pattern).matches(text)) is bool
