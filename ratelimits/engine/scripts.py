"""The Lua scripts as Redis runs them, built from the files in `lua/` and the contract.

Each script starts with the constants and the plan's layout generated from
`ratelimits.engine.contract` (`lua_constants()`), then the shared prelude; the charging
scripts add `functions_of(algorithm)`, a branch per registered algorithm giving its check
and commit functions.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources

from ratelimits.engine.layout import (
    LEASE_ARGS,
    LIMIT_SPEC,
    LUA_CONSTANTS,
    REFUND_ARGS,
    REFUND_HEAD,
)
from ratelimits.engine.registry import REGISTRY

__all__ = [
    "batch_library",
    "batch_source",
    "lease_source",
    "lua_constants",
    "offend_source",
    "refund_source",
    "release_source",
    "renew_source",
    "slot_source",
    "version_source",
]


def lua_constants() -> str:
    """The `local` declarations the script starts with, one per line."""
    lines = [f"local {name} = {value!r}" for name, value in LUA_CONSTANTS.items()]
    # where each of a limit's values is among what string.find answers for its spec in
    # a plan with SPEC_PATTERN: the spec's start and end, then its values (SPEC_LIMIT = 4)
    lines += [f"local SPEC_{name.upper()} = {i}" for i, name in enumerate(LIMIT_SPEC, 3)]
    # the algorithms whose limits send the client's field with each call
    windowed = ", ".join(f"{name} = true" for name, a in REGISTRY.items() if a.windowed)
    lines.append(f"local WINDOWED = {{{windowed}}}")
    return "\n".join(lines)


def _dispatcher(name: str, params: str, bodies: dict[str, str]) -> str:
    lines = [f"local function {name}(algorithm, {params})"]
    for i, (algorithm, body) in enumerate(bodies.items()):
        lines.append(f"  {'if' if i == 0 else 'elseif'} algorithm == '{algorithm}' then")
        lines += [f"    {line}" if line else "" for line in body.strip("\n").split("\n")]
    lines += ["  else", "    error('unknown algorithm ' .. tostring(algorithm))", "  end", "end"]
    return "\n".join(lines)


@lru_cache(maxsize=1)
def batch_source() -> str:
    """The batch script: the generated constants, the prelude, the algorithms' check and
    commit functions (`functions_of`), the entry point."""
    return _charging_source("batch.lua")


@lru_cache(maxsize=1)
def batch_library() -> tuple[str, str]:
    """(function name, library code): the batch script as a Redis Functions library, its
    helpers defined once at `FUNCTION LOAD` and its plans parsed once, instead of on every
    call. The name carries a digest of the code, so processes running two versions of the
    app side by side (a rolling deploy) each call their own."""
    name = "ratelimits_batch_" + hashlib.sha1(batch_source().encode()).hexdigest()[:16]
    lua = resources.files("ratelimits.engine") / "lua"
    names = ", ".join(_GLOBALS)
    code = "\n".join(
        (
            f"#!lua name={name}",
            # A function reads each global through the metatable Redis puts on its
            # globals: the library reads the ones it uses once, into locals. Not while it
            # loads: loading sees only the `redis` of register_function.
            f"local function api() return {names} end",
            "local loading = redis",
            f"local {names}",
            *_charging_parts(),
            "local function batch(KEYS, ARGV)",
            f"if not tonumber then {names} = api() end",
            (lua / "batch.lua").read_text("utf-8"),
            "end",
            f"loading.register_function('{name}', batch)",
        )
    )
    return name, code


#: The globals the charging scripts use (see `batch_library`).
_GLOBALS = ("redis", "tonumber", "tostring", "math", "string", "unpack", "type", "error")


def _bodies() -> dict[str, tuple[str, str, str]]:
    """Each algorithm's check, commit and refund bodies (the refund is Redis Cluster's)."""
    lua = resources.files("ratelimits.engine") / "lua"
    out = {}
    for entry in REGISTRY.values():
        if entry.learned:
            continue  # decided in process, never by a script
        text = (lua / entry.lua).read_text("utf-8")
        _, _, bodies = text.partition("--[[check]]")
        check, _, rest = bodies.partition("--[[commit]]")
        commit, _, refund = rest.partition("--[[refund]]")
        out[entry.name] = (check, commit, refund)
    return out


def _functions_of(checks: dict[str, str], commits: dict[str, str]) -> str:
    """`functions_of(algorithm)`: a new check and commit function of `algorithm`. A plan
    holds its limits' (see lua/check_all.lua), made when it is parsed: once per plan in
    the library, and by EVALSHA only for the algorithms the call names."""
    lines = ["local function functions_of(algorithm)"]
    for i, (algorithm, check) in enumerate(checks.items()):
        lines.append(f"  {'if' if i == 0 else 'elseif'} algorithm == '{algorithm}' then")
        lines.append("    return function(key, f, now, L, P, B, c, mw, cal)")
        lines += [f"      {line}" if line else "" for line in check.strip("\n").split("\n")]
        lines.append("    end, function(key, f, now, L, P, B, c, r, token)")
        lines += [f"      {line}" if line else ""
                  for line in commits[algorithm].strip("\n").split("\n")]
        lines.append("    end")
    lines += ["  end", "  error('unknown algorithm ' .. tostring(algorithm))", "end"]
    return "\n".join(lines)


def _charging_parts() -> tuple[str, ...]:
    """What every charging script starts with: the generated constants, the prelude, the
    algorithms' check and commit functions, and the check of every limit of a call."""
    lua = resources.files("ratelimits.engine") / "lua"
    bodies = _bodies()
    return (
        "-- generated from ratelimits/engine/scripts.py",
        lua_constants(),
        (lua / "prelude.lua").read_text("utf-8"),
        _functions_of({name: b[0] for name, b in bodies.items()},
                      {name: b[1] for name, b in bodies.items()}),
        (lua / "check_all.lua").read_text("utf-8"),
    )


def _charging_source(entry: str) -> str:
    lua = resources.files("ratelimits.engine") / "lua"
    return "\n".join((*_charging_parts(), (lua / entry).read_text("utf-8")))


@lru_cache(maxsize=1)
def slot_source() -> str:
    """Redis Cluster: the script that decides one hash slot's limits (see lua/slot.lua)."""
    return _charging_source("slot.lua")


@lru_cache(maxsize=1)
def refund_source() -> str:
    """Redis Cluster: the script that gives back what slot.lua charged (lua/refund.lua)."""
    lua = resources.files("ratelimits.engine") / "lua"
    return "\n".join(
        (
            "-- generated from ratelimits/engine/scripts.py",
            lua_constants(),
            (lua / "prelude.lua").read_text("utf-8"),
            f"local REFUND_HEAD = {len(REFUND_HEAD)}",
            f"local REFUND_PER = {len(REFUND_ARGS)}",
            *(f"local REFUND_{name.upper()} = {i}" for i, name in enumerate(REFUND_ARGS, 1)),
            (lua / "refund_prelude.lua").read_text("utf-8"),
            _dispatcher("refund", "key, f, now, L, P, B, c, token, s1, s2",
                        {name: b[2] for name, b in _bodies().items()}),
            (lua / "refund.lua").read_text("utf-8"),
        )
    )


@lru_cache(maxsize=1)
def offend_source() -> str:
    """The script that adds tallied refusals to offenders (lua/offend.lua)."""
    lua = resources.files("ratelimits.engine") / "lua"
    return "\n".join(
        ("-- generated from ratelimits/engine/scripts.py", lua_constants(),
         (lua / "prelude.lua").read_text("utf-8"), (lua / "offend.lua").read_text("utf-8"))
    )


@lru_cache(maxsize=1)
def renew_source() -> str:
    """The script that keeps running requests' slots (see lua/renew.lua)."""
    lua = resources.files("ratelimits.engine") / "lua"
    return "\n".join(
        (
            "-- generated from ratelimits/engine/scripts.py",
            lua_constants(),
            (lua / "prelude.lua").read_text("utf-8"),
            (lua / "renew.lua").read_text("utf-8"),
        )
    )


def release_source() -> str:
    """Redis Cluster: the script that frees finished requests' slots (lua/release.lua)."""
    lua = resources.files("ratelimits.engine") / "lua"
    return "-- generated from ratelimits/engine/scripts.py\n" + (
        lua / "release.lua").read_text("utf-8")


@lru_cache(maxsize=1)
def lease_source() -> str:
    """The script that leases units of windowed limits and takes unspent ones back."""
    lua = resources.files("ratelimits.engine") / "lua"
    offsets = [f"local LEASE_{name.upper()} = {i}" for i, name in enumerate(LEASE_ARGS, 1)]
    return "\n".join(
        (
            "-- generated from ratelimits/engine/scripts.py",
            lua_constants(),
            f"local LEASE_PER = {len(LEASE_ARGS)}",
            *offsets,
            (lua / "prelude.lua").read_text("utf-8"),
            (lua / "lease.lua").read_text("utf-8"),
        )
    )


@lru_cache(maxsize=1)
def version_source() -> str:
    """The script that bumps the policy version, never to a number handed out before
    (see lua/version.lua)."""
    return (resources.files("ratelimits.engine") / "lua" / "version.lua").read_text("utf-8")
