"""The batch script as a Redis Function, with EVALSHA where the server has none.

Redis 7 keeps a library loaded with `FUNCTION LOAD` (persisted and replicated with the
data) and runs it with `FCALL`. The script's helpers are then built once, when the
library loads, instead of at the start of every call, and each call's plan is parsed
once (see `contract.encode`): about half of the server's time per decision
(`bench/capacity.py` measures both). A server without Functions (Redis 6) or a user
whose ACL denies them gets the same script by EVALSHA, chosen at the first call and
kept; a library the server lost (`FUNCTION FLUSH`, a restart without persistence, a
failover to a replica that never had it) is loaded again by the call that meets its
absence, as redis-py does for a script after NOSCRIPT. The call is one command that the
blocking engine and its asyncio twin each send; its recovery, rare, is a flow (`flows`)
that both run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ratelimits.engine.flows import Flow
from ratelimits.engine.transport import Command, Script

__all__ = ["StoredScript", "loaded_mode", "next_step"]

#: How the server says that a library is missing, or that it has no Functions (Redis 6):
#: both are `ERR` replies, told apart only by their text, which Redis 7 and Valkey 8
#: word alike. A user whose ACL denies Functions gets a `NOPERM` reply, told by its code
#: (redis-py's `NoPermissionError`), however the server words it.
_NOT_FOUND = "function not found"
_NO_FUNCTIONS = "unknown command"


class StoredScript:
    """Run one script as the function `library[0]`, or by EVALSHA of `source`.

    A call is `head` and a body, `(numkeys, *keys, *args)`: the head is the command and
    its name or SHA for the mode learnt of the server (the mode is one per server,
    shared by the engine and its asyncio twin). `recovering()` is what a call that
    failed does next, as a flow (`flows`): the library loaded, or EVALSHA chosen, and
    the call made again; `call()` is a whole call with that recovery.
    """

    def __init__(self, library: tuple[str, str], source: str) -> None:
        self.name, self.code = library
        self.script = Script(source)
        #: the command a call starts with, for the mode: FCALL of the library's function
        #: until the server is found to lack Functions, EVALSHA of the script then
        self.head: tuple[str, str] = ("FCALL", self.name)
        self._mode: str | None = None

    @property
    def mode(self) -> str | None:
        """"fcall" once the library is known loaded, "evalsha" when the server cannot
        run it; None until the first call finds out."""
        return self._mode

    @mode.setter
    def mode(self, mode: str | None) -> None:
        self._mode = mode
        self.head = ("EVALSHA", self.script.sha) if mode == "evalsha" else ("FCALL", self.name)

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The call of `keys` and `args` as one command, for the mode learnt."""
        return (*self.head, len(keys), *keys, *args)

    def call(self, body: tuple[Any, ...]) -> Flow[Any]:
        """The call's reply; a library the server lacks is loaded (once) first."""
        try:
            return (yield Command(*self.head, *body))
        except redis.ResponseError as exc:
            error = exc
        return (yield from self.recovering(error, body))

    def recovering(self, error: Exception, body: tuple[Any, ...]) -> Flow[Any]:
        """After a call of `body` failed with `error`: the library loaded (or EVALSHA
        chosen, or the script loaded) and the call made again, its reply; `error` raised
        when it is an error of the call itself."""
        if not (yield from self.recover(error)):
            raise error
        if self._mode != "evalsha":  # the library loaded just now
            return (yield Command(*self.head, *body))
        numkeys = body[0]
        return (yield from self.script.call(body[1:1 + numkeys], body[1 + numkeys:]))

    def recover(self, error: Exception) -> Flow[bool]:
        """After `error` from a call: load the library, or fall back to EVALSHA, and say
        whether the call may be made again. Errors of the call itself give False."""
        step = next_step(error)
        if step == "evalsha":
            self.mode = "evalsha"
        elif step == "load":
            yield from self.load()
        return step is not None

    def load(self) -> Flow[None]:
        """Load the library (once per server; a library already there is kept)."""
        try:
            yield Command("FUNCTION LOAD", self.code)
        except redis.ResponseError as exc:
            self.mode = loaded_mode(exc)
        else:
            self.mode = "fcall"


def next_step(error: Exception) -> str | None:
    """What a failed call asks for: "evalsha" (the server or the user has no Functions),
    "load" (the library is missing), "again" (a pipelined EVALSHA met NOSCRIPT: the call
    alone loads the script), or None (an error of the call itself)."""
    if isinstance(error, redis.exceptions.NoScriptError):
        return "again"
    if isinstance(error, redis.exceptions.NoPermissionError):
        return "evalsha"
    if not isinstance(error, redis.ResponseError):
        return None
    message = str(error).lower()
    if _NO_FUNCTIONS in message:
        return "evalsha"
    if _NOT_FOUND in message:
        return "load"
    return None


def loaded_mode(error: redis.ResponseError) -> str:
    """The mode after `FUNCTION LOAD` failed with `error` (raised again when it is not
    "already loaded" or "no Functions here")."""
    if isinstance(error, redis.exceptions.NoPermissionError):
        return "evalsha"
    message = str(error).lower()
    if "already exists" in message:
        return "fcall"
    if _NO_FUNCTIONS in message:
        return "evalsha"
    raise error
