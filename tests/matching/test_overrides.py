"""Overrides and tiers: a client, network, group or tier with another limit, or exempt."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from ratelimits.engine.types import Limit
from ratelimits.matching.overrides import Match, OverrideTable, Rule, parse_match
from ratelimits.models import Override

pytestmark = pytest.mark.django_db
URL = "/admin/ratelimits/override/"


# -- what an operator may write -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "text", "parsed"),
    [
        ("ip", "ip:203.0.113.7", Match("exact", "ip:203.0.113.7")),
        ("ip", " ip:203.0.113.0/24 ", Match("network", ipaddress.ip_network("203.0.113.0/24"))),
        ("ip", "ip:2001:db8::/48", Match("network", ipaddress.ip_network("2001:db8::/48"))),
        ("ip", "ip:2001:db8:1:2::99", Match("exact", "ip:2001:db8:1:2::/64")),  # counted per /64
        ("user", "user:42", Match("exact", "user:42")),
        ("user", "group:partners", Match("group", "partners")),
        ("user_or_ip", "ip:10.0.0.0/8", Match("network", ipaddress.ip_network("10.0.0.0/8"))),
        ("user_or_ip", "user:7", Match("exact", "user:7")),
        ("header:X-Api-Key", "header:k-123", Match("exact", "header:k-123")),
        ("global", "tier:gold", Match("tier", "gold")),
        ("ip", "tier:free", Match("tier", "free")),
    ],
)
def test_each_match_kind_parses_in_the_policys_key_terms(key, text, parsed):
    assert parse_match(key, text) == parsed


@pytest.mark.parametrize(
    ("key", "text", "says"),
    [
        ("ip", "203.0.113.7", "write the kind and the value, e.g. ip:203.0.113.7"),
        ("ip", "user:42", "this policy counts by ip: write e.g. ip:203.0.113.7"),
        ("ip", "ip:203.0.113.0/33", "is not a network; write e.g. ip:203.0.113.0/24"),
        ("ip", "ip:not-an-address", "is not an IP address"),
        ("ip", "ip:2001:db8::/96", "IPv6 clients are counted per /64"),
        ("ip", "ip:10.1.2.3/8", "'10.1.2.3/8' has bits set past its /8: the network it "
         "falls in is 10.0.0.0/8; write ip:10.0.0.0/8 for that network, or ip:10.1.2.3 for "
         "the one address"),
        ("ip", "ip:2001:db8::1/48", "the network it falls in is 2001:db8::/48"),
        ("ip", "group:staff", "group: matches users; this policy counts by ip"),
        ("user", "header:x", "write e.g. user:42, group:<Django group> or tier:<name>"),
        ("user", "tier:", "write the kind and the value"),
    ],
)
def test_an_invalid_match_says_what_to_write(key, text, says):
    with pytest.raises(ValueError) as info:
        parse_match(key, text)
    assert says in str(info.value)


# -- precedence, at explicit times --------------------------------------------------------


def rule(i, exempt=False, limit=None, expires=None):
    template = None if exempt else Limit("", "fixed_window", limit, 60, name="p")
    return Rule(i, exempt, template, expires)


def table(*pairs):
    return OverrideTable.of((parse_match(key, text), r) for key, text, r in pairs)


def find(t, identity, now=1000.0, groups=(), tier=None):
    return t.find(identity, now, lambda: groups, lambda: tier)


def test_exact_beats_network_and_the_longest_prefix_wins():
    t = table(("ip", "ip:203.0.113.7", rule(1, limit=50)),
              ("ip", "ip:203.0.113.0/24", rule(2, limit=20)),
              ("ip", "ip:203.0.0.0/16", rule(3, limit=10)))
    assert find(t, "ip:203.0.113.7").id == 1
    assert find(t, "ip:203.0.113.8").id == 2
    assert find(t, "ip:203.0.9.9").id == 3
    assert find(t, "ip:198.51.100.1") is None


def test_ipv6_clients_fall_in_networks_by_their_64():
    t = table(("ip", "ip:2001:db8::/32", rule(1, limit=10)),
              ("ip", "ip:2001:db8:aa::/48", rule(2, limit=20)),
              ("ip", "ip:2001:db8:aa:1::/64", rule(3, limit=30)))
    assert find(t, "ip:2001:db8:aa:1::/64").id == 3
    assert find(t, "ip:2001:db8:aa:2::/64").id == 2
    assert find(t, "ip:2001:db8:bb:2::/64").id == 1
    assert find(t, "ip:2001:db9::/64") is None


def test_the_most_specific_match_wins_exempt_or_not():
    t = table(("ip", "ip:10.0.0.0/8", rule(1, exempt=True)),
              ("ip", "ip:10.1.0.0/16", rule(2, limit=5)),
              ("ip", "ip:10.1.2.3", rule(3, limit=1)),
              ("ip", "ip:10.1.2.0/24", rule(4, exempt=True)))
    assert find(t, "ip:10.9.9.9").exempt  # only the /8 holds it
    assert find(t, "ip:10.1.9.9").id == 2  # the /16 is more specific than the exempt /8
    assert find(t, "ip:10.1.2.3").id == 3  # the address itself
    assert find(t, "ip:10.1.2.4").id == 4  # the exempt /24 inside the limited /16


def test_of_two_overrides_of_the_same_clients_the_more_generous_applies():
    """Rows stored before a second override of the same clients was refused; the order
    the rows come in does not matter."""
    pairs = [(Match("network", ipaddress.ip_network("10.0.0.0/8")), rule(1, exempt=True)),
             (Match("network", ipaddress.ip_network("10.0.0.0/8")), rule(2, limit=1)),
             (Match("exact", "ip:10.1.2.3"), rule(3, limit=1)),
             (Match("exact", "ip:10.1.2.3"), rule(4, limit=9)),
             (Match("tier", "gold"), rule(5, limit=7)),
             (Match("tier", "gold"), rule(6, limit=7))]
    for ordered in (pairs, pairs[::-1]):
        t = OverrideTable.of(ordered)
        assert find(t, "ip:10.9.9.9").id == 1  # exempt over a limit
        assert find(t, "ip:10.1.2.3").id == 4  # the higher limit
        assert find(t, "ip:192.0.2.1", tier="gold").id == 5  # equal: the older row


def test_the_most_generous_of_groups_and_tier_applies():
    t = table(("user", "group:partners", rule(1, limit=100)),
              ("user", "group:staff", rule(2, limit=1000)),
              ("user", "tier:gold", rule(3, limit=500)),
              ("user", "user:9", rule(4, limit=5)))
    assert find(t, "user:1", groups=["partners"], tier="gold").id == 3
    assert find(t, "user:1", groups=["partners", "staff"], tier="gold").id == 2
    assert find(t, "user:1", groups=[], tier="free") is None
    assert find(t, "user:9", groups=["staff"]).id == 4  # the exact one is more specific


def test_an_override_stops_applying_when_it_expires_without_an_edit():
    t = table(("ip", "ip:203.0.113.7", rule(1, limit=50, expires=2000.0)),
              ("ip", "ip:203.0.113.0/24", rule(2, limit=20)))
    assert find(t, "ip:203.0.113.7", now=1999.9).id == 1
    assert find(t, "ip:203.0.113.7", now=2000.0).id == 2  # expired: the network's now


def test_groups_and_tiers_are_asked_only_when_the_policy_has_such_overrides():
    asked = []
    t = table(("user", "user:1", rule(1, limit=5)))
    t.find("user:1", 0.0, lambda: asked.append("groups") or (),
           lambda: asked.append("tier"))
    assert asked == []


# -- through the middleware ---------------------------------------------------------------


def override(policy, match, **fields):
    o = Override(policy=policy, match=match, **fields)
    o.full_clean()
    o.save()
    return o


def statuses(client, n, **extra):
    return [client.get("/hello/", **extra).status_code for _ in range(n)]


def test_an_ip_override_and_an_exempt_network_through_the_middleware(
    client, make_policy, django_capture_on_commit_callbacks, django_assert_num_queries, any_store
):
    policy = make_policy(name="per-ip", limit=2, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "ip:203.0.113.7", limit=4, note="partner")
        override(policy, "ip:198.51.100.0/24", exempt=True, note="office")
    assert statuses(client, 5, REMOTE_ADDR="203.0.113.7") == [200] * 4 + [429]
    response = client.get("/hello/", REMOTE_ADDR="203.0.113.7")
    assert response["RateLimit-Policy"] == '"per-ip";q=4;w=3600'  # the limit applied
    with django_assert_num_queries(0):  # resolved from the snapshot
        assert statuses(client, 5, REMOTE_ADDR="198.51.100.20") == [200] * 5
        office = client.get("/hello/", REMOTE_ADDR="198.51.100.20")
        assert not office.has_header("RateLimit")  # exempt: the policy does not apply
    assert statuses(client, 3, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]  # the default


def test_an_expired_override_no_longer_applies(client, make_policy,
                                               django_capture_on_commit_callbacks):
    policy = make_policy(name="per-ip", limit=1, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "ip:203.0.113.7", exempt=True,
                 expires=timezone.now() - timedelta(seconds=1))
        override(policy, "ip:203.0.113.8", exempt=True,
                 expires=timezone.now() + timedelta(hours=1))
    assert statuses(client, 2, REMOTE_ADDR="203.0.113.7") == [200, 429]
    assert statuses(client, 2, REMOTE_ADDR="203.0.113.8") == [200, 200]


def test_an_override_expires_on_the_apps_clock(client, make_policy, clock,
                                              django_capture_on_commit_callbacks):
    """The app's one clock decides when an override ends, as it decides the windows: a
    test (or a replay) that moves it sees the override lapse without waiting."""
    policy = make_policy(name="per-ip", limit=1, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "ip:203.0.113.7", exempt=True,
                 expires=timezone.now() + timedelta(hours=1))
    assert statuses(client, 2, REMOTE_ADDR="203.0.113.7") == [200, 200]  # exempt
    clock.advance(2 * 3600)  # past its expiry, and into a fresh window
    assert statuses(client, 2, REMOTE_ADDR="203.0.113.7") == [200, 429]


def test_a_group_override_follows_the_groups_members(
    client, make_policy, django_user_model, django_capture_on_commit_callbacks
):
    user = django_user_model.objects.create_user("ann", password="pw")
    partners = Group.objects.create(name="partners")
    policy = make_policy(name="per-user", key="user", limit=1, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "group:partners", limit=3)
    client.force_login(user)
    assert statuses(client, 2) == [200, 429]  # not a partner yet
    with django_capture_on_commit_callbacks(execute=True):
        user.groups.add(partners)  # published like an edit
    assert statuses(client, 3) == [200, 200, 429]  # 3 in all: 1 before, 2 now


TIERS: list[str] = []


def plan_of(request):
    """The tier function the tests configure: the X-Plan header."""
    TIERS.append(request.path)
    return request.META.get("HTTP_X_PLAN")


def test_tier_overrides_apply_and_the_tier_is_asked_once_per_request(
    client, make_policy, settings, django_capture_on_commit_callbacks
):
    settings.RATELIMITS = {**settings.RATELIMITS, "TIER": f"{__name__}.plan_of"}
    a = make_policy(name="a", limit=1, path="/hello/")
    b = make_policy(name="b", limit=1, path="/hello/", key="global")
    with django_capture_on_commit_callbacks(execute=True):
        override(a, "tier:gold", limit=3)
        override(b, "tier:gold", limit=3)
    TIERS.clear()
    assert statuses(client, 4, HTTP_X_PLAN="gold") == [200, 200, 200, 429]
    assert TIERS == ["/hello/"] * 4  # once per request, for both policies
    assert statuses(client, 1, HTTP_X_PLAN="free", REMOTE_ADDR="192.0.2.9") == [429]  # b


def broken_tier(request):
    raise RuntimeError("the plans service is down")


def test_a_failing_tier_function_means_no_tier_never_a_500(
    client, make_policy, settings, caplog, django_capture_on_commit_callbacks
):
    settings.RATELIMITS = {**settings.RATELIMITS, "TIER": f"{__name__}.broken_tier"}
    policy = make_policy(name="a", limit=1, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "tier:gold", limit=3)
    assert statuses(client, 2) == [200, 429]
    assert "the TIER function failed" in caplog.text


# -- the admin ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"match": "user:1"}, "match", "This policy counts by ip"),
        ({"match": "ip:1.2.3.4", "exempt": True, "limit": 5}, "exempt", "clear limit"),
        ({"match": "ip:1.2.3.4"}, "limit", "or tick exempt"),
        ({"match": "ip:1.2.3.4", "limit": 5, "burst": 3}, "burst", "has no burst"),
    ],
)
def test_an_invalid_override_is_refused_with_what_to_fix(make_policy, fields, field, says):
    policy = make_policy(name="per-ip", limit=2)
    with pytest.raises(ValidationError) as info:
        Override(policy=policy, **fields).full_clean()
    assert says in " ".join(info.value.message_dict[field])


def test_overrides_are_edited_inline_and_listed_with_their_expiry(
    admin_client, make_policy, django_capture_on_commit_callbacks
):
    policy = make_policy(name="per-ip", limit=2, path="/hello/")
    page = admin_client.get(f"/admin/ratelimits/policy/{policy.pk}/change/").content.decode()
    assert "overrides-TOTAL_FORMS" in page  # the inline is on the policy's page
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "ip:203.0.113.7", limit=50, note="partner Acme")
        override(policy, "ip:198.51.100.0/24", exempt=True, note="office",
                 expires=timezone.now() - timedelta(days=1))
    listing = admin_client.get(URL).content.decode()
    assert "50 per hour" in listing and "exempt" in listing and "(expired)" in listing
    found = admin_client.get(URL, {"q": "Acme"}).content.decode()
    assert "203.0.113.7" in found and "198.51.100.0/24" not in found
    live = admin_client.get(URL, {"expiry": "live"}).content.decode()
    assert "203.0.113.7" in live and "198.51.100.0/24" not in live


def test_an_override_saved_in_the_admin_applies_at_the_next_request(
    admin_client, client, make_policy, django_capture_on_commit_callbacks
):
    policy = make_policy(name="per-ip", limit=1, path="/hello/")
    assert statuses(client, 2, REMOTE_ADDR="203.0.113.7") == [200, 429]
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(URL + "add/", {
            "policy": policy.pk, "match": "ip:203.0.113.7", "limit": 3, "burst": "",
            "expires_0": "", "expires_1": "", "note": "raised for a demo"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert statuses(client, 3, REMOTE_ADDR="203.0.113.7") == [200, 200, 429]


# -- overlapping overrides ------------------------------------------------------------------


def test_a_network_with_host_bits_is_refused_naming_the_network(make_policy):
    policy = make_policy(name="per-ip", limit=5)
    with pytest.raises(ValidationError) as info:
        Override(policy=policy, match="ip:10.1.2.3/8", limit=1).full_clean()
    (message,) = info.value.message_dict["match"]
    assert "the network it falls in is 10.0.0.0/8; write ip:10.0.0.0/8" in message


@pytest.mark.parametrize(("first", "second"), [
    ("ip:2001:db8:1:2::1", "ip:2001:db8:1:2::99"),  # one /64 client
    ("ip:2001:db8::/48", "ip:2001:DB8:0::/48"),
])
def test_a_second_override_of_the_same_clients_is_refused(make_policy, first, second):
    policy = make_policy(name="per-ip", limit=5)
    override(policy, first, exempt=True)
    with pytest.raises(ValidationError) as info:
        Override(policy=policy, match=second, limit=1).full_clean()
    assert info.value.message_dict["match"] == [
        f"This policy already has an override for the same clients, {first!r}: change "
        "that one, or delete it first."]


def test_a_limited_address_inside_an_exempt_network_through_the_middleware(
    client, make_policy, django_capture_on_commit_callbacks, any_store
):
    policy = make_policy(name="per-ip", limit=3, path="/hello/")
    with django_capture_on_commit_callbacks(execute=True):
        override(policy, "ip:10.0.0.0/8", exempt=True, note="office")
        override(policy, "ip:10.1.2.3", limit=1, note="a noisy machine")
        # stored before a second row for the same network was refused
        Override.objects.create(policy=policy, match="ip:10.1.2.3/8", limit=1)
    assert statuses(client, 4, REMOTE_ADDR="10.9.9.9") == [200] * 4  # the exempt /8
    assert statuses(client, 2, REMOTE_ADDR="10.1.2.3") == [200, 429]  # the address itself
    assert statuses(client, 4, REMOTE_ADDR="192.0.2.1") == [200, 200, 200, 429]


@pytest.mark.parametrize(("match", "warned"), [
    ("ip:0.0.0.0/0", "every IPv4 client"), ("ip:::/0", "every IPv6 client"),
    ("ip:10.0.0.0/8", None),
])
def test_the_admin_warns_of_an_override_exempting_everyone(admin_client, make_policy, match,
                                                           warned):
    policy = make_policy(name="per-ip", limit=1, path="/hello/")
    response = admin_client.post(URL + "add/", {
        "policy": policy.pk, "match": match, "exempt": "on", "limit": "", "burst": "",
        "expires_0": "", "expires_1": "", "note": ""}, follow=True)
    assert Override.objects.filter(match=match).exists()
    page = response.content.decode().replace("&#x27;", "'")
    if warned:
        assert (f"The override '{match}' exempts {warned} from the policy 'per-ip': it no "
                "longer limits anyone") in page
    else:
        assert "exempts every" not in page


def test_policy_names_differing_only_in_case_are_refused(make_policy):
    from ratelimits.models import Policy

    make_policy(name="Dup2")
    with pytest.raises(ValidationError) as info:
        Policy(name="dup2", mode="shadow", limit=1, key="ip").full_clean()
    assert info.value.message_dict["name"] == [
        "A policy named 'Dup2' exists; names may not differ only in case. Choose another "
        "name, or change that policy."]
