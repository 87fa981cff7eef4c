"""The RATELIMITS accessor: defaults, refusals, and clearing on settings changes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from ratelimits.conf import SETTINGS, build_config, get_config, setting_or_default


def test_defaults_fill_every_key():
    config = build_config({})
    assert set(config) == set(SETTINGS)
    assert config["ENABLED"] is True
    assert config["CACHE"] == "default"
    assert config["HEADERS"] == "ietf"
    assert config["IPV6_PREFIX"] == 64
    assert config["PROXY_HEADER"] == "x-forwarded-for"


def test_unknown_keys_are_refused_with_the_valid_list():
    with pytest.raises(ImproperlyConfigured) as info:
        build_config({"ENABLE": False})
    message = str(info.value)
    assert "ENABLE" in message and "valid keys are" in message and "ENABLED" in message


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("ENABLED", "yes", "True or False"),
        ("HEADERS", "draft", "ietf, legacy, both, none"),
        ("MAX_DELAY", -1, "positive number"),
        ("IPV6_PREFIX", 200, "1 to 128"),
        ("REJECT_VIEW", "noviews", "dotted import path"),
        ("TRUSTED_PROXIES", "10.0.0.0/8", "list of IP"),
        ("CACHE", "", "non-empty string"),
        ("CLOCK", "server", "one of 'store', 'client'"),
        ("CLOCK", ["client"], "one of 'store', 'client'"),
    ],
)
def test_bad_values_are_refused_naming_the_key(key, value, says):
    with pytest.raises(ImproperlyConfigured) as info:
        build_config({key: value})
    assert key in str(info.value) and says in str(info.value)


def test_accessor_is_cached_and_cleared_when_settings_change():
    first = get_config()
    assert get_config() is first
    with override_settings(RATELIMITS={"HEADERS": "legacy"}):
        assert get_config()["HEADERS"] == "legacy"
    assert get_config()["HEADERS"] == "ietf"


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("forwarded", "forwarded"),
        ("X-Forwarded-For", "x-forwarded-for"),
        (" X-Real-IP ", "x-real-ip"),
        ("CF-Connecting-IP", "cf-connecting-ip"),
    ],
)
def test_proxy_header_is_stored_lower_case(value, stored):
    assert build_config({"PROXY_HEADER": value})["PROXY_HEADER"] == stored


@pytest.mark.parametrize(
    "value", ["HTTP_X_FORWARDED_FOR", "x_real_ip", "", "x forwarded for", "for:", None, 1]
)
def test_proxy_header_refusal_says_what_to_write(value):
    with pytest.raises(ImproperlyConfigured) as info:
        build_config({"PROXY_HEADER": value})
    message = str(info.value)
    assert message.startswith("RATELIMITS['PROXY_HEADER'] must name the one header")
    assert "'x-forwarded-for', 'forwarded' (RFC 7239) or e.g. 'x-real-ip'" in message
    assert repr(value) in message


def test_the_settings_page_gives_every_key_its_default_and_a_section():
    """docs/settings.md: a row per key in "Every key", with the default of conf.py, and a
    section of its own per key."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    table = page.split("\n## Every key\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| `")]
    defaults = {key.strip().strip("`"): ast.literal_eval(default.strip().strip("`"))
                for key, default in rows}
    assert defaults == {name: setting.default for name, setting in SETTINGS.items()}
    sections = re.findall(r"^### `([A-Z_0-9]+)`$", page, re.MULTILINE)
    assert sorted(sections) == sorted(SETTINGS)


@pytest.mark.parametrize(("ratelimits", "max_delay"), [
    ({"MAX_DELAY": 10}, 10.0),  # valid settings: the value
    ({"MAX_DELAY": 10, "HEADRS": "ietf"}, 10.0),  # another key's typo: still the value
    ({"MAX_DELAY": "long"}, 5.0),  # this key invalid: the default
    ({"HEADRS": "ietf"}, 5.0),  # not set: the default
    (["not", "a", "dict"], 5.0),
])
def test_setting_or_default_reads_a_valid_value_beside_an_invalid_key(ratelimits, max_delay):
    """A declaration validated while RATELIMITS is invalid (manage.py check imports the
    URLconf before it reports E001) sees the user's MAX_DELAY when that one is valid, so
    a max_wait it allows is not refused as if the default applied."""
    with override_settings(RATELIMITS=ratelimits):
        assert setting_or_default("MAX_DELAY") == max_delay
