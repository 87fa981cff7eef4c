"""What operators write for a key kind: the check of a key's argument (`header:<Name>`,
`call:<dotted.path>` ...), and the identity a client typed in the admin or on the command
line stands for under a kind (`KeyKind.from_text`).

The kinds' table (`keykinds.KEY_KINDS`) names these functions in its rows; none of them
runs on a request.
"""

from __future__ import annotations

import ipaddress
import re

from ratelimits.matching.identity import bounded, client_ip, is_header_name, normalized

__all__ = [
    "code_name",
    "dotted_path",
    "header_name",
    "parameter_name",
    "typed_global",
    "typed_ip",
    "typed_user_or_ip",
    "typed_value",
]

# -- argument checks: None when the argument is fine, else what to fix ------------------

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", re.ASCII)


def header_name(arg: str) -> str | None:
    if "_" in arg:
        # Django folds '-' and '_' together in META, and servers drop '_' headers.
        return f"header name {arg!r} contains '_'; write '-', e.g. header:X-Api-Key"
    if not is_header_name(arg):
        return (
            f"header name {arg!r} is not a valid HTTP header name; use letters, digits "
            "and '-', e.g. header:X-Api-Key"
        )
    return None


def parameter_name(arg: str) -> str | None:
    if any(c.isspace() for c in arg):
        return f"query parameter name {arg!r} contains whitespace; remove it"
    return None


def code_name(arg: str) -> str | None:
    if arg.strip() != arg or not arg:
        return f"code:{arg!r} must name a limit declared in code, without spaces around it"
    return None


def dotted_path(arg: str) -> str | None:
    if not _DOTTED.fullmatch(arg):
        return (
            f"{arg!r} is not a dotted Python path; write module.function, "
            "e.g. call:myapp.keys.tenant"
        )
    return None


# -- what an operator types: the identity it stands for, or ValueError saying why -------


def typed_value(kind: str, value: str, normalizes: bool = False) -> str:
    text = value.strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix == kind:
        if rest.startswith("h:"):
            return text  # already a hashed identity, as the admin and logs show it
        text = rest
    if normalizes and text:
        text = normalized(text.strip()) or ""  # as a request's value is
    if not text:
        raise ValueError("the client is empty")
    return bounded(kind, text)


def typed_ip(value: str, ipv6_prefix: int) -> str:
    text = value.strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix == "ip":
        if rest.startswith("h:"):
            return text
        text = rest
    address = client_ip({"REMOTE_ADDR": text.split("/", 1)[0]}, (), ipv6_prefix)
    if address is None:
        raise ValueError(f"{value!r} is not an IP address (e.g. 203.0.113.9)")
    return f"ip:{address}"


def typed_user_or_ip(value: str, ipv6_prefix: int) -> str:
    text = value.strip()
    prefix = text.partition(":")[0]
    if prefix not in ("user", "ip"):
        try:
            ipaddress.ip_address(text.split("/", 1)[0])
            prefix = "ip"
        except ValueError:
            prefix = "user"
    # the `ip` and `user` rows' own (`keykinds.KEY_KINDS`)
    return typed_ip(value, ipv6_prefix) if prefix == "ip" else typed_value("user", value)


def typed_global(value: str, ipv6_prefix: int) -> str:
    if value.strip() not in ("global", ""):
        raise ValueError("this policy counts everyone together: the client is 'global'")
    return "global"
