"""The batch script as a Redis Function, with EVALSHA where the server has none.

Redis 7 keeps a library loaded with `FUNCTION LOAD` (persisted and replicated with the
data) and runs it with `FCALL`. The script's helpers and its check and commit
dispatchers are then built once, when the library loads, instead of at the start of
every call: about a sixth of the server's time per decision (`bench/capacity.py`
measures both). A server without Functions (Redis 6) or a user whose ACL denies them gets
the same script by EVALSHA, chosen at the first call and kept; a library the server lost
(`FUNCTION FLUSH`, a restart without persistence, a failover to a replica that never had
it) is loaded again by the call that meets its absence, as redis-py does for a script
after NOSCRIPT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["StoredScript", "loaded_mode", "next_step"]

#: How the server says that a library is missing, or that it has no Functions for us.
_NOT_FOUND = "function not found"
_NO_FUNCTIONS = ("unknown command", "noperm", "no permissions")


class StoredScript:
    """Run one script as the function `library[0]`, or by EVALSHA of `source`.

    Called like a redis-py `Script`: `script(keys=..., args=...)`. `command()` gives the
    call for a pipeline and `recover()` says whether a pipelined call that failed may be
    run again alone.
    """

    def __init__(self, client: Any, library: tuple[str, str], source: str) -> None:
        self.client = client
        self.name, self.code = library
        self.script = client.register_script(source)
        #: "fcall" once the library is known loaded, "evalsha" when the server cannot
        #: run it; None until the first call finds out.
        self.mode: str | None = None

    def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self.mode != "evalsha":
            try:
                return self.client.fcall(self.name, len(keys), *keys, *args)
            except redis.ResponseError as exc:
                if not self.recover(exc):
                    raise
            if self.mode == "fcall":  # loaded just now
                return self.client.fcall(self.name, len(keys), *keys, *args)
        return self.script(keys=keys, args=args)

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The call as a command for `pipeline.execute_command()`."""
        if self.mode == "evalsha":
            return ("EVALSHA", self.script.sha, len(keys), *keys, *args)
        return ("FCALL", self.name, len(keys), *keys, *args)

    def recover(self, error: Exception) -> bool:
        """After `error` from a call: load the library, or fall back to EVALSHA, and say
        whether the call may be made again. Errors of the call itself return False."""
        step = next_step(error)
        if step == "evalsha":
            self.mode = "evalsha"
        elif step == "load":
            self.load()
        return step is not None

    def load(self) -> None:
        """Load the library (once per server; a library already there is kept)."""
        try:
            self.client.function_load(self.code)
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
    if not isinstance(error, redis.ResponseError):
        return None
    message = str(error).lower()
    if any(text in message for text in _NO_FUNCTIONS):
        return "evalsha"
    if _NOT_FOUND in message:
        return "load"
    return None


def loaded_mode(error: redis.ResponseError) -> str:
    """The mode after `FUNCTION LOAD` failed with `error` (raised again when it is not
    "already loaded" or "no Functions here")."""
    message = str(error).lower()
    if "already exists" in message:
        return "fcall"
    if any(text in message for text in _NO_FUNCTIONS):
        return "evalsha"
    raise error
