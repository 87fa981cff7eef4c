"""Client identity: key specs, client IP behind trusted proxies, bounded identities."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimits.matching.identity import (
    MAX_IDENTITY,
    IdentityError,
    client_ip,
    display_identity,
    parse_trusted_proxies,
    reset_proxy_warning,
)
from ratelimits.matching.keykinds import KeySpec, parse_key

factory = RequestFactory()
PROXIES = parse_trusted_proxies(["10.0.0.0/8", "2001:db8:ffff::/48"])


class User:
    is_authenticated = True
    pk = 7


def ip_of(request: Any, trusted: Any = PROXIES, prefix: int = 64) -> str | None:
    return parse_key("ip").identify(request, trusted_proxies=trusted, ipv6_prefix=prefix)


# --- trusted proxies -------------------------------------------------------------------


def test_parse_trusted_proxies_accepts_addresses_and_networks() -> None:
    networks = parse_trusted_proxies(["10.0.0.1", " 192.168.0.0/16 ", "10.1.2.3/8", "::1"])
    assert [str(n) for n in networks] == ["10.0.0.1/32", "192.168.0.0/16", "10.0.0.0/8", "::1/128"]


@pytest.mark.parametrize("bad", ["10.0.0.300", "proxy.local", "", "10.0.0.0/33", 10])
def test_parse_trusted_proxies_names_the_bad_item(bad: Any) -> None:
    with pytest.raises(ValueError, match="is not an IP address or CIDR network") as info:
        parse_trusted_proxies(["10.0.0.1", bad])
    assert repr(bad) in str(info.value)


# --- client IP -------------------------------------------------------------------------


def test_remote_addr_by_default() -> None:
    assert ip_of(factory.get("/", REMOTE_ADDR="203.0.113.9")) == "ip:203.0.113.9"
    assert client_ip({"REMOTE_ADDR": "203.0.113.9"}, ()) == "203.0.113.9"


@pytest.mark.parametrize("forged", ["1.1.1.1", "2.2.2.2, 3.3.3.3", "4.4.4.4", "unknown"])
def test_forged_forwarded_headers_from_an_untrusted_peer_are_ignored(forged: str) -> None:
    request = factory.get(
        "/",
        REMOTE_ADDR="203.0.113.9",
        HTTP_X_FORWARDED_FOR=forged,
        HTTP_FORWARDED=f"for={forged}",
    )
    assert ip_of(request) == "ip:203.0.113.9"


def test_rotating_xff_gives_no_fresh_identity_behind_a_trusted_proxy() -> None:
    # The proxy appends the real peer, so what the client forged stays on the left.
    identities = {
        ip_of(
            factory.get(
                "/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=f"9.9.9.{n}, 198.51.100.7"
            )
        )
        for n in range(20)
    }
    assert identities == {"ip:198.51.100.7"}


@pytest.mark.parametrize(
    ("xff", "expected"),
    [
        ("198.51.100.7", "198.51.100.7"),
        ("198.51.100.7, 10.0.0.5", "198.51.100.7"),
        ("1.1.1.1, 198.51.100.7, 10.0.0.5, 10.0.0.6", "198.51.100.7"),
        ("10.0.0.7, 10.0.0.6", "10.0.0.7"),  # every hop trusted: the left-most
        ("garbage, 10.0.0.6", "10.0.0.6"),  # garbage ends the walk at the last good hop
        ("198.51.100.7, garbage", "10.0.0.2"),
        ("", "10.0.0.2"),
        ("198.51.100.7:5678", "198.51.100.7"),
        ("[2001:db8::1]:80", "2001:db8::/64"),
        ("198.51.100.7,10.0.0.5", "198.51.100.7"),
        ("1.1.1.1, 2.2.2.2, 198.51.100.7", "198.51.100.7"),
    ],
)
def test_trusted_proxy_chain_takes_the_rightmost_untrusted(xff: str, expected: str) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": xff}
    assert client_ip(meta, PROXIES) == expected


def test_xff_wins_over_forwarded_when_both_are_present() -> None:
    meta = {
        "REMOTE_ADDR": "10.0.0.2",
        "HTTP_X_FORWARDED_FOR": "198.51.100.7",
        "HTTP_FORWARDED": "for=192.0.2.60",
    }
    assert client_ip(meta, PROXIES) == "198.51.100.7"


@pytest.mark.parametrize(
    ("forwarded", "expected"),
    [
        ("for=192.0.2.60", "192.0.2.60"),
        ("For=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ("proto=https; for=192.0.2.60", "192.0.2.60"),
        ('for="192.0.2.60:4711"', "192.0.2.60"),
        ('for="[2001:db8:cafe::17]:4711"', "2001:db8:cafe::/64"),
        ('for="[2001:db8:cafe::17]"', "2001:db8:cafe::/64"),
        ("for=192.0.2.43, for=198.51.100.17", "198.51.100.17"),
        ("for=192.0.2.43, for=10.0.0.9", "192.0.2.43"),
        ("for=192.0.2.43, for=unknown", "10.0.0.2"),
        ('for=192.0.2.43, for="_hidden"', "10.0.0.2"),
        ("for=unknown, for=192.0.2.43", "192.0.2.43"),
        ("proto=http", "10.0.0.2"),
        ("for=", "10.0.0.2"),
    ],
)
def test_forwarded_header(forwarded: str, expected: str) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_FORWARDED": forwarded}
    assert client_ip(meta, PROXIES, proxy_header="forwarded") == expected


# --- which header the proxy sets -------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_proxy_warning() -> Any:
    reset_proxy_warning()
    yield
    reset_proxy_warning()


def test_forged_xff_gives_no_fresh_identity_behind_a_forwarded_only_proxy() -> None:
    # The proxy sets Forwarded and passes the client's own X-Forwarded-For through.
    identities = {
        parse_key("ip").identify(
            factory.get(
                "/",
                REMOTE_ADDR="10.0.0.2",
                HTTP_FORWARDED="for=198.51.100.7",
                HTTP_X_FORWARDED_FOR=f"9.9.9.{n}",
            ),
            trusted_proxies=PROXIES,
            proxy_header="forwarded",
        )
        for n in range(20)
    }
    assert identities == {"ip:198.51.100.7"}


META_ALL = {
    "REMOTE_ADDR": "10.0.0.2",
    "HTTP_X_FORWARDED_FOR": "192.0.2.1",
    "HTTP_FORWARDED": "for=192.0.2.2",
    "HTTP_X_REAL_IP": "192.0.2.3",
    "HTTP_CF_CONNECTING_IP": "192.0.2.4",
}


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("x-forwarded-for", "192.0.2.1"),
        ("forwarded", "192.0.2.2"),
        ("x-real-ip", "192.0.2.3"),
        ("cf-connecting-ip", "192.0.2.4"),
        ("X-Real-IP", "192.0.2.3"),  # header names are case-insensitive
        ("x-client-ip", "10.0.0.2"),  # absent: the trusted peer itself
    ],
)
def test_only_the_chosen_header_is_read(header: str, expected: str) -> None:
    assert client_ip(META_ALL, PROXIES, proxy_header=header) == expected
    request = factory.get("/", **META_ALL)
    identity = parse_key("ip").identify(request, trusted_proxies=PROXIES, proxy_header=header)
    assert identity == f"ip:{expected}"


def test_the_default_header_is_x_forwarded_for() -> None:
    assert client_ip(META_ALL, PROXIES) == "192.0.2.1"
    meta = {k: v for k, v in META_ALL.items() if k != "HTTP_X_FORWARDED_FOR"}
    assert client_ip(meta, PROXIES) == "10.0.0.2"  # Forwarded alone is not read


def test_a_chosen_header_walks_its_hops_like_x_forwarded_for() -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_REAL_IP": "1.1.1.1, 198.51.100.7, 10.0.0.5"}
    assert client_ip(meta, PROXIES, proxy_header="x-real-ip") == "198.51.100.7"


def test_the_chosen_header_is_ignored_from_an_untrusted_peer() -> None:
    meta = {**META_ALL, "REMOTE_ADDR": "203.0.113.9"}
    for header in ("x-forwarded-for", "forwarded", "x-real-ip"):
        assert client_ip(meta, PROXIES, proxy_header=header) == "203.0.113.9"


def proxy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "PROXY_HEADER" in r.getMessage()]


def test_both_headers_from_a_trusted_proxy_warn_once_per_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "9.9.9.9"}
    with caplog.at_level("WARNING", logger="ratelimits"):
        client_ip(meta, PROXIES)  # only the header read: nothing to say
        assert proxy_warnings(caplog) == []
        for n in range(3):
            client_ip({**meta, "HTTP_FORWARDED": f"for=198.51.100.{n}"}, PROXIES)
    (message,) = proxy_warnings(caplog)
    assert "10.0.0.2" in message and "Forwarded: for=198.51.100.0" in message
    assert "X-Forwarded-For: 9.9.9.9" in message
    assert "set PROXY_HEADER to 'forwarded'" in message
    assert caplog.records[-1].levelname == "WARNING"


def test_the_warning_names_the_other_header_when_forwarded_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "9.9.9.9"}  # no Forwarded
    with caplog.at_level("WARNING", logger="ratelimits"):
        assert client_ip(meta, PROXIES, proxy_header="forwarded") == "10.0.0.2"
    (message,) = proxy_warnings(caplog)
    assert "X-Forwarded-For: 9.9.9.9" in message and "Forwarded: absent" in message
    assert "set PROXY_HEADER to 'x-forwarded-for'" in message


def test_no_warning_from_an_untrusted_peer_or_for_other_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="ratelimits"):
        client_ip({**META_ALL, "REMOTE_ADDR": "203.0.113.9"}, PROXIES)
        client_ip(META_ALL, PROXIES, proxy_header="x-real-ip")
    assert proxy_warnings(caplog) == []


def test_the_warning_escapes_and_bounds_what_the_client_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meta = {
        "REMOTE_ADDR": "10.0.0.2",
        "HTTP_X_FORWARDED_FOR": "1.2.3.4",
        "HTTP_FORWARDED": "for=1.2.3.4\r\nFAKE: \x1b[31m" + "x" * 100_000,
    }
    with caplog.at_level("WARNING", logger="ratelimits"):
        client_ip(meta, PROXIES)
    (message,) = proxy_warnings(caplog)
    assert not any(c in message for c in "\r\n\x1b")  # no forged log lines, no terminal codes
    assert "for=1.2.3.4\\r\\nFAKE: \\x1b[31m" in message  # shown escaped instead
    assert len(message) < 600  # the 100 KB value is cut


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("203.0.113.9:5678", "203.0.113.9"),
        ("[2001:db8::1]:80", "2001:db8::/64"),
        ("::ffff:198.51.100.7", "198.51.100.7"),
        ("[::ffff:198.51.100.7]:80", "198.51.100.7"),
        ("fe80::1%eth0", "fe80::/64"),
        ("  203.0.113.9  ", "203.0.113.9"),
    ],
)
def test_ports_brackets_and_mapped_addresses(remote: str, expected: str) -> None:
    assert client_ip({"REMOTE_ADDR": remote}, ()) == expected


def test_ipv4_mapped_proxy_is_trusted_as_ipv4() -> None:
    meta = {"REMOTE_ADDR": "::ffff:10.0.0.2", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}
    assert client_ip(meta, PROXIES) == "198.51.100.7"


def test_ipv6_addresses_in_one_slash_64_share_an_identity() -> None:
    a = ip_of(factory.get("/", REMOTE_ADDR="2001:db8:1:2::1"))
    b = ip_of(factory.get("/", REMOTE_ADDR="2001:db8:1:2:ffff:ffff:ffff:ffff"))
    c = ip_of(factory.get("/", REMOTE_ADDR="2001:db8:1:3::1"))
    assert a == b == "ip:2001:db8:1:2::/64"
    assert c != a


def test_ipv6_prefix_is_configurable() -> None:
    a = factory.get("/", REMOTE_ADDR="2001:db8:1:2::1")
    b = factory.get("/", REMOTE_ADDR="2001:db8:1:3::1")
    assert ip_of(a, prefix=48) == ip_of(b, prefix=48) == "ip:2001:db8:1::/48"
    assert ip_of(a, prefix=128) == "ip:2001:db8:1:2::1/128"
    assert ip_of(a, prefix=128) != ip_of(
        factory.get("/", REMOTE_ADDR="2001:db8:1:2::2"), prefix=128
    )


def test_trusted_ipv6_proxy() -> None:
    meta = {"REMOTE_ADDR": "2001:db8:ffff::1", "HTTP_X_FORWARDED_FOR": "2001:db8:aaaa::5"}
    assert client_ip(meta, PROXIES) == "2001:db8:aaaa::/64"


@pytest.mark.parametrize("remote", [None, "", "garbage", "999.1.1.1", "1.2.3.4:http", "\x00", 42])
def test_no_valid_remote_addr_gives_no_identity(remote: Any) -> None:
    meta = {} if remote is None else {"REMOTE_ADDR": remote}
    meta["HTTP_X_FORWARDED_FOR"] = "198.51.100.7"
    assert client_ip(meta, PROXIES) is None
    request = factory.get("/")
    request.META = meta
    assert ip_of(request) is None


@pytest.mark.parametrize(
    "header",
    [
        "1" * 1_000_000,
        "198.51.100.7," * 100_000,
        ", " * 500_000,
        "\x00" * 1000,
        "1.2.3.4\x00, 5.6.7.8",
        "\ud800, \udfff",
        "é, ß, 😀",
        "[" * 10_000,
        "for=" * 10_000,
    ],
)
def test_garbage_and_huge_headers_never_raise(header: str) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": header, "HTTP_FORWARDED": header}
    result = client_ip(meta, PROXIES)
    assert result is None or len(result) <= 50
    for proxy_header in ("forwarded", "x-forwarded-for"):
        result = client_ip(meta, PROXIES, proxy_header=proxy_header)
        assert result is None or len(result) <= 50
    only = {"REMOTE_ADDR": "10.0.0.2", "HTTP_FORWARDED": header}
    assert client_ip(only, PROXIES, proxy_header="forwarded") is not None


def test_huge_header_reads_only_the_right_end() -> None:
    xff = "1.1.1.1, " * 200_000 + "198.51.100.7"
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": xff}
    assert client_ip(meta, PROXIES) == "198.51.100.7"
    # A value cut by the 8 KB bound must not be read as a different address.
    cut = "11.2.3.4" + ", 10.0.0.9" * 1000
    assert client_ip({"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": cut}, PROXIES)[:3] == "10."


# --- parse_key -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "arg"),
    [
        ("ip", "ip", ""),
        ("  user ", "user", ""),
        ("user_or_ip", "user_or_ip", ""),
        ("global", "global", ""),
        ("IP", "ip", ""),
        ("header:X-Api-Key", "header", "X-Api-Key"),
        ("Header:x-api-key", "header", "x-api-key"),
        ("query:api_key", "query", "api_key"),
        ("query:q[]", "query", "q[]"),
        ("call:myapp.keys.tenant", "call", "myapp.keys.tenant"),
        ("call:no_such_module_xyz.fn", "call", "no_such_module_xyz.fn"),  # not imported here
    ],
)
def test_parse_key_valid_forms(spec: str, kind: str, arg: str) -> None:
    assert parse_key(spec) == KeySpec(kind, arg)


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("", "key is empty"),
        ("   ", "key is empty"),
        ("cookie:sid", "unknown key 'cookie:sid'; use ip, user, user_or_ip, global"),
        ("ipaddress", "unknown key 'ipaddress'"),
        ("ip:1.2.3.4", "'ip' takes no argument"),
        ("global:x", "'global' takes no argument"),
        ("header:", "header: needs a header name"),
        ("header:X Api", "not a valid HTTP header name"),
        ("header:X-Api:Key", "not a valid HTTP header name"),
        ("header:X_Api_Key", "write '-'"),
        ("query:", "query: needs a query parameter name"),
        ("query:a b", "contains whitespace"),
        ("call:", "call: needs a dotted path"),
        ("call:tenant", "not a dotted Python path"),
        ("call:myapp..tenant", "not a dotted Python path"),
        ("call:myapp.keys.tenant()", "not a dotted Python path"),
        ("call:1app.fn", "not a dotted Python path"),
    ],
)
def test_parse_key_refusals_say_what_to_fix(spec: str, hint: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_key(spec)
    assert hint in str(info.value)


# --- identify --------------------------------------------------------------------------


def test_user_keys() -> None:
    request = factory.get("/", REMOTE_ADDR="203.0.113.9")
    request.user = AnonymousUser()
    assert parse_key("user").identify(request) is None
    assert parse_key("user_or_ip").identify(request) == "ip:203.0.113.9"
    request.user = User()
    assert parse_key("user").identify(request) == "user:7"
    assert parse_key("user_or_ip").identify(request) == "user:7"


def test_user_without_user_attribute_is_anonymous() -> None:
    assert parse_key("user").identify(factory.get("/")) is None


def test_drf_request_user_is_used() -> None:
    from rest_framework.request import Request

    http = factory.get("/", REMOTE_ADDR="203.0.113.9", HTTP_X_API_KEY="k1")
    http.user = AnonymousUser()
    drf = Request(http)
    drf.user = User()  # what DRF authentication sets
    assert parse_key("user").identify(drf) == "user:7"
    assert parse_key("ip").identify(drf) == "ip:203.0.113.9"
    assert parse_key("header:X-Api-Key").identify(drf) == "header:k1"


def test_user_property_raising_becomes_identity_error() -> None:
    class Broken:
        @property
        def user(self) -> Any:
            raise RuntimeError("session store down")

    with pytest.raises(IdentityError, match="RuntimeError: session store down"):
        parse_key("user").identify(Broken())


def test_global_key() -> None:
    assert parse_key("global").identify(factory.get("/")) == "global"


def test_header_key() -> None:
    spec = parse_key("header:x-api-key")
    assert spec.identify(factory.get("/", HTTP_X_API_KEY="secret-1")) == "header:secret-1"
    assert spec.identify(factory.get("/")) is None
    assert spec.identify(factory.get("/", HTTP_X_API_KEY="  ")) is None
    typed = factory.post("/", data="{}", content_type="application/json")
    assert parse_key("header:Content-Type").identify(typed) == "header:application/json"


def test_query_key() -> None:
    spec = parse_key("query:api_key")
    assert spec.identify(factory.get("/", {"api_key": "abc"})) == "query:abc"
    assert spec.identify(factory.get("/")) is None
    assert spec.identify(factory.get("/", {"api_key": ""})) is None


def _install_keys_module() -> str:
    module = types.ModuleType("ratelimits_test_keys")

    def tenant(request: Any) -> Any:
        return request.META.get("HTTP_X_TENANT")

    def number(request: Any) -> int:
        return 42

    def boom(request: Any) -> str:
        raise KeyError("tenant")

    module.tenant, module.number, module.boom, module.value = tenant, number, boom, 3
    sys.modules[module.__name__] = module
    return module.__name__


def test_call_key() -> None:
    name = _install_keys_module()
    spec = parse_key(f"call:{name}.tenant")
    assert spec.identify(factory.get("/", HTTP_X_TENANT="acme")) == "call:acme"
    assert spec.identify(factory.get("/")) is None
    assert parse_key(f"call:{name}.number").identify(factory.get("/")) == "call:42"


def test_call_raising_becomes_identity_error() -> None:
    name = _install_keys_module()
    with pytest.raises(IdentityError, match=rf"{name}\.boom raised KeyError: 'tenant'"):
        parse_key(f"call:{name}.boom").identify(factory.get("/"))


@pytest.mark.parametrize(
    "path", ["no_such_module_xyz.fn", "ratelimits_test_keys.missing", "ratelimits_test_keys.value"]
)
def test_call_import_failure_becomes_identity_error(path: str) -> None:
    _install_keys_module()
    with pytest.raises(IdentityError, match="could not be loaded"):
        parse_key(f"call:{path}").identify(factory.get("/"))


@pytest.mark.parametrize(
    "value", ["x" * 1000, "caf\u00e9", "a\x00b", "\ud800", "line\nbreak", "h:deadbeef"]
)
def test_long_or_unprintable_identities_are_hashed(value: str) -> None:
    request = factory.get("/")
    request.META["HTTP_X_API_KEY"] = value
    identity = parse_key("header:X-Api-Key").identify(request)
    assert identity is not None
    assert identity.startswith("header:h:")
    assert len(identity) == len("header:h:") + 32
    assert identity.isascii() and identity.isprintable()


def test_hashed_identities_stay_distinct() -> None:
    spec = parse_key("header:X-Api-Key")
    a = spec.identify(factory.get("/", HTTP_X_API_KEY="x" * 300))
    b = spec.identify(factory.get("/", HTTP_X_API_KEY="x" * 301))
    assert a != b


def test_identities_at_the_bound_are_kept() -> None:
    value = "k" * (MAX_IDENTITY - len("header:"))
    request = factory.get("/", HTTP_X_API_KEY=value)
    assert parse_key("header:X-Api-Key").identify(request) == "header:" + value


# --- display_identity ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "shown"),
    [
        ("ip:203.0.113.9", "ip:203.0.113.9"),
        ("a\x00b", "a\\x00b"),
        ("a\nb\x1b[31m", "a\\nb\\x1b[31m"),
        ("\u202eevil", "\\u202eevil"),
        ("x" * 80, "x" * 80),
        ("x" * 81, "x" * 79 + "…"),
        ("x" * 1_000_000, "x" * 79 + "…"),
    ],
)
def test_display_identity(identity: str, shown: str) -> None:
    assert display_identity(identity) == shown


@given(st.text())
def test_display_identity_is_bounded_and_printable(identity: str) -> None:
    shown = display_identity(identity)
    assert len(shown) <= 80
    assert shown.isprintable()


# --- fuzz ------------------------------------------------------------------------------

SPECS = [
    parse_key(s) for s in ("ip", "user", "user_or_ip", "global", "header:X-Api-Key", "query:q")
]
header_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["1.2.3.4", "10.0.0.1", "[::1]:80", "for=", '"', ",", ";"])).map(
        "".join
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    remote=header_text,
    xff=header_text,
    forwarded=header_text,
    api_key=st.text(max_size=300),
    path=st.text(max_size=100),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "WEIRD"]),
    prefix=st.integers(min_value=1, max_value=128),
    proxy_header=st.sampled_from(["x-forwarded-for", "forwarded", "x-api-key"]),
)
def test_identify_and_client_ip_never_raise(
    remote: str,
    xff: str,
    forwarded: str,
    api_key: str,
    path: str,
    method: str,
    prefix: int,
    proxy_header: str,
) -> None:
    request = factory.generic(method, "/")
    request.path_info = path
    request.user = AnonymousUser()
    request.META.update(
        REMOTE_ADDR=remote,
        HTTP_X_FORWARDED_FOR=xff,
        HTTP_FORWARDED=forwarded,
        HTTP_X_API_KEY=api_key,
    )
    for trusted in ((), PROXIES, parse_trusted_proxies(["0.0.0.0/0", "::/0"])):
        result = client_ip(request.META, trusted, prefix, proxy_header)
        assert result is None or len(result) <= 50
        for spec in SPECS:
            identity = spec.identify(
                request, trusted_proxies=trusted, ipv6_prefix=prefix, proxy_header=proxy_header
            )
            assert identity is None or len(identity) <= MAX_IDENTITY


# --- the client read once per peer and header ---------------------------------------------


def test_a_remembered_client_is_read_again_under_other_trusted_proxies() -> None:
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}
    assert client_ip(meta, PROXIES) == "198.51.100.7"
    assert client_ip(meta, PROXIES) == "198.51.100.7"  # remembered
    # the proxy is no longer trusted: the peer is the client
    assert client_ip(meta, parse_trusted_proxies(["192.0.2.0/24"])) == "10.0.0.2"
    assert client_ip(meta, PROXIES) == "198.51.100.7"
    assert client_ip(meta, PROXIES, ipv6_prefix=48) == "198.51.100.7"
    assert client_ip(meta, PROXIES, proxy_header="x-real-ip") == "10.0.0.2"


def test_a_long_or_odd_header_is_read_afresh_and_right() -> None:
    hops = ", ".join(f"198.51.100.{n}" for n in range(60))  # longer than is remembered
    meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": hops}
    assert client_ip(meta, PROXIES) == "198.51.100.59"
    assert client_ip({**meta, "HTTP_X_FORWARDED_FOR": hops + ", 10.0.0.9"}, PROXIES) == (
        "198.51.100.59")
    assert client_ip({"REMOTE_ADDR": b"10.0.0.2"}, PROXIES) is None  # not text: no client
    assert client_ip(meta, list(PROXIES)) == "198.51.100.59"  # proxies given as a list


def test_the_other_header_warning_looks_at_each_request_of_a_remembered_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meta = {"REMOTE_ADDR": "10.0.0.3", "HTTP_X_FORWARDED_FOR": "9.9.9.8"}
    with caplog.at_level("WARNING", logger="ratelimits"):
        assert client_ip(meta, PROXIES) == "9.9.9.8"
        assert proxy_warnings(caplog) == []
        # the same peer and header, remembered; this request also carries Forwarded
        assert client_ip({**meta, "HTTP_FORWARDED": "for=198.51.100.1"}, PROXIES) == "9.9.9.8"
    (message,) = proxy_warnings(caplog)
    assert "10.0.0.3" in message and "Forwarded: for=198.51.100.1" in message
