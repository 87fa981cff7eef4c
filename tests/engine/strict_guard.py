"""The scripts as a strict server runs them: every `redis.call` checked against KEYS.

Managed services that restrict scripts (ElastiCache Serverless, Dragonfly by default)
refuse a script that touches a key it was not given, or that is given none; some refuse
`TIME` too. `guarding()` makes every script and function the engines send a guarded
copy: its `redis` is a table whose `call` and `pcall` raise on a key not in KEYS (the
key positions of each command the scripts use read from the server's `COMMAND INFO`,
so a command the guard does not know is refused rather than let through), a call
without keys fails at once, and with `clock="client"` `TIME` is refused. Each copy has
a name and a SHA of its own, so the server runs it, not an unguarded one it kept.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources

import pytest
import redis

from ratelimits.engine import heartbeat, redis_backend, scripts

#: Where the error of a guard starts: the tests look for it.
REFUSED = "strict guard:"

#: The functions the engines take their scripts' text from, by the name they import.
SOURCES = ("batch_source", "slot_source", "refund_source", "offend_source", "renew_source",
           "lease_source", "version_source", "live_source")


def commands_used() -> set[str]:
    """Every command a script of ours calls, read from the Lua files."""
    lua = resources.files("ratelimits.engine") / "lua"
    found: set[str] = set()
    for entry in lua.iterdir():
        if entry.name.endswith(".lua"):
            found |= set(re.findall(r"redis\.p?call\('([A-Z]+)'", entry.read_text("utf-8")))
    return found


def key_positions(client: redis.Redis) -> dict[str, tuple[int, int, int]]:
    """(first key, last key, step) of each command the scripts use, as the server
    declares them (`COMMAND INFO`: last -1 is the last argument; 0, 0, 0: no keys)."""
    names = sorted(commands_used())
    raw = client.execute_command("COMMAND", "INFO", *names, NEVER_DECODE=True)
    out = {}
    if isinstance(raw, dict):  # redis-py's parsed form
        for name, info in raw.items():
            out[str(name).upper()] = (int(info["first_key_pos"]), int(info["last_key_pos"]),
                                      int(info["step_count"]))
    else:
        for info in raw:
            out[info[0].decode().upper()] = (int(info[3]), int(info[4]), int(info[5]))
    missing = set(names) - set(out)
    assert not missing, f"the server does not know {missing}"
    return out


def guard_lua(positions: dict[str, tuple[int, int, int]], *, no_time: bool) -> str:
    """`strict_guard(real, keys)`: a `redis` for one call of a script given `keys`."""
    table = ", ".join(f"{name} = {{{a}, {b}, {c}}}" for name, (a, b, c) in
                      sorted(positions.items()))
    return f"""
local function strict_guard(real, keys)
  local POSITIONS = {{{table}}}
  if #keys == 0 then error('{REFUSED} a call without keys') end
  local declared = {{}}
  for _, k in ipairs(keys) do declared[k] = true end
  local function check(command, ...)
    local name = string.upper(command)
    if {'true' if no_time else 'false'} and name == 'TIME' then
      error('{REFUSED} TIME called while the clock is the client\\'s')
    end
    local at = POSITIONS[name]
    if not at then error('{REFUSED} ' .. name .. ' is unknown to the guard') end
    local args = {{...}}
    local first, last, step = at[1], at[2], at[3]
    if first > 0 then
      if last < 0 then last = #args + 1 + last end
      for i = first, last, step do
        if not declared[args[i]] then
          error('{REFUSED} ' .. name .. ' touches ' .. tostring(args[i]) ..
                ', not in KEYS')
        end
      end
    end
  end
  local guarded = {{}}
  guarded.call = function(command, ...)
    check(command, ...)
    return real.call(command, ...)
  end
  guarded.pcall = function(command, ...)
    check(command, ...)
    return real.pcall(command, ...)
  end
  return setmetatable(guarded, {{__index = real}})
end
"""


def guarded_source(source: str, guard: str) -> str:
    """A script run by EVAL(SHA), its `redis` the guard's for the call's KEYS."""
    return "\n".join((guard, "local redis = strict_guard(redis, KEYS)", source))


def guarded_library(library: tuple[str, str], guard: str, tag: str) -> tuple[str, str]:
    """The batch library, its `redis` the guard's for each call's KEYS, under a name of
    its own."""
    name, code = library
    new = f"{name}_{tag}"
    code = code.replace(name, new)
    head = "local function batch(KEYS, ARGV)\n"
    assert head in code
    names = ", ".join(scripts._GLOBALS)
    loaded = f"if not tonumber then {names} = api() end\n"
    assert loaded in code
    code = code.replace(head, f"{guard}\nlocal unguarded\n{head}", 1)
    code = code.replace(loaded, loaded + "unguarded = unguarded or redis\n"
                        "redis = strict_guard(unguarded, KEYS)\n", 1)
    return new, code


class Guarded:
    """The guarded copies in use: what a test asks the servers whether they ran."""

    def __init__(self) -> None:
        #: each script's SHA, by the function its text comes from
        self.shas: dict[str, str] = {}
        #: the batch library's name
        self.library = ""

    def ran(self, nodes: list[redis.Redis]) -> set[str]:
        """The scripts (by the function their text comes from) that some node of
        `nodes` was sent, and "batch_library" when a node holds the library."""
        out = set()
        for name, sha in self.shas.items():
            if any(node.script_exists(sha)[0] for node in nodes):
                out.add(name)
        libraries = set()
        for node in nodes:
            for entry in node.function_list():
                fields = entry if isinstance(entry, dict) else dict(
                    zip(entry[::2], entry[1::2], strict=True))
                libraries.add(fields[b"library_name"].decode())
        if self.library in libraries:
            out.add("batch_library")
        return out


@contextmanager
def guarding(client: redis.Redis, *, clock: str = "store") -> Iterator[Guarded]:
    """Every script the engines build from now on is guarded (see the module). The
    server's scripts and functions are flushed first, so that `Guarded.ran` says what
    the test sent."""
    client.script_flush()
    client.function_flush()
    guarded = Guarded()
    guard = guard_lua(key_positions(client), no_time=clock == "client")
    tag = "guarded_" + hashlib.sha1(guard.encode()).hexdigest()[:8]
    patch = pytest.MonkeyPatch()
    originals: dict[str, Callable[[], str]] = {name: getattr(scripts, name, None)
                                               for name in SOURCES}
    originals["live_source"] = heartbeat.live_source

    def wrap(original: Callable[[], str]) -> Callable[[], str]:
        @cache
        def source() -> str:
            text = guarded_source(original(), guard)
            guarded.shas[original.__name__] = hashlib.sha1(text.encode()).hexdigest()
            return text
        return source

    wrapped = {name: wrap(f) for name, f in originals.items()}
    original_library = scripts.batch_library
    library = original_library()
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("ratelimits."):
            continue
        for name in SOURCES:
            if getattr(module, name, None) is originals[name]:
                patch.setattr(module, name, wrapped[name])
        if getattr(module, "batch_library", None) is original_library:
            patch.setattr(module, "batch_library", lambda: guarded_library(library, guard, tag))
    guarded.library = guarded_library(library, guard, tag)[0]
    heartbeat.live_script.cache_clear()
    redis_backend.lease_script.cache_clear()
    try:
        yield guarded
    finally:
        patch.undo()
        heartbeat.live_script.cache_clear()
        redis_backend.lease_script.cache_clear()
