"""Every key kind, declared once: how it reads a request, how its argument is checked,
and the facts the rest of the app asks about it.

A new kind is one `KeyKind` entry in `KEY_KINDS` and a small reader function; its
argument's check, and how an operator's text names one of its clients when that is its
own, are functions of `keysyntax`. Parsing, identifying, the usage message, the admin's
help, override matches, the async stack's choices and traffic replay all derive from the
table. What a request runs (the readers, `KeySpec.read`) is here, beside the table.
Nothing here imports Django.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

from ratelimits.matching.identity import (
    DEFAULT_PROXY_HEADER,
    IdentityError,
    Network,
    bounded,
    call_function,
    call_reader,
    client_ip,
    form_field,
    meta_name,
    normalized,
    user_pk,
)
from ratelimits.matching.keysyntax import (
    code_name,
    dotted_path,
    header_name,
    parameter_name,
    typed_global,
    typed_ip,
    typed_user_or_ip,
    typed_value,
)

__all__ = [
    "CONNECTION_META",
    "KEY_KINDS",
    "WEBSOCKET_CONNECT",
    "WEBSOCKET_RECEIVE",
    "WEBSOCKET_SCOPES",
    "KeyKind",
    "KeyKinds",
    "KeySpec",
    "Logged",
    "Proxies",
    "identity_from_text",
    "parse_key",
]


class Proxies(NamedTuple):
    """How the client address is read: the trusted proxies, the IPv6 prefix counted, and
    the header the proxies name the client in."""

    trusted: Sequence[Network] = ()
    ipv6_prefix: int = 64
    header: str = DEFAULT_PROXY_HEADER


class Logged(NamedTuple):
    """What an access log line tells of its client: its `ip:` and `user:` identities (None
    when absent) and the query string."""

    ip: str | None
    user: str | None
    query: str | None


#: `read(request, arg, proxies)`: the kind's value (or identity, see `KeyKind.hashed`)
#: for a request; None when the policy does not apply. May raise `IdentityError`.
Reader = Callable[[Any, str, Proxies], str | None]
#: `check(arg)`: None when the argument is fine, else what to fix.
Check = Callable[[str], str | None]
#: `from_log(line, arg)`: the identity an access log line gives, or None.
LogReader = Callable[[Logged, str], str | None]
#: `typed(value, ipv6_prefix)`: the identity an operator means by `value` (as typed, with
#: any whitespace around it); ValueError saying why when there is none.
Typed = Callable[[str, int], str]


@dataclass(frozen=True, slots=True)
class KeyKind:
    """One key kind and its facts."""

    name: str
    read: Reader
    #: How operators write it in the list of keys ("header:<Name>"); "" when it is not
    #: typed in the admin (set by code).
    usage: str = ""
    #: The argument's check; None when the kind takes no argument.
    check: Check | None = None
    #: What to write when the argument is missing.
    missing: str = ""
    #: The reader gives a value, counted as `<name>:<value>` (a digest when long or not
    #: printable); else the reader gives the whole identity (`global`, `user_or_ip`).
    hashed: bool = True
    #: Reads `request.user` (the async stack loads it first).
    reads_user: bool = False
    #: Calls a function of the user's, which may block: the async stack runs it in a thread.
    calls_code: bool = False
    #: Its value is whatever the client sends (a header, a parameter, a form field):
    #: anyone can send someone else's, so a lockout keyed by it can be aimed at them.
    client_sent: bool = False
    #: Its identity is an account (the signed-in user, the username a login form posts),
    #: so a response during which that account proved itself (`reset_on`) is its own:
    #: a reset by any other key is one that some other client can cause.
    names_account: bool = False
    #: The identity an access log line gives; None when a log cannot tell it.
    from_log: LogReader | None = None
    #: Its `from_log` reads the query string.
    log_query: bool = False
    #: Why a log cannot tell it, when more can be said than that it cannot.
    not_in_log: str = ""
    #: Each identity is one client's: a replay log may be split across processes by it.
    splittable: bool = False
    #: An override's match in its terms, for messages; "" for `<name>:<value>`.
    example: str = ""
    #: Other spellings (django-ratelimit's `get:` is our `query:`).
    aliases: tuple[str, ...] = ()
    #: The kinds its identities are written as; () for just its own.
    counts_as: tuple[str, ...] = ()
    #: How an operator's text becomes one of its identities; None: `<name>:<text>`.
    typed: Typed | None = None
    #: Its values are compared as Django's login compares a username: NFKC-normalized
    #: (`normalized()`), case kept.
    normalizes: bool = False

    @property
    def takes_argument(self) -> bool:
        return self.check is not None

    @property
    def identity_kinds(self) -> tuple[str, ...]:
        """The prefixes of its identities: `user` and `ip` for `user_or_ip`."""
        return self.counts_as or (self.name,)

    @property
    def match_example(self) -> str:
        return self.example or f"{self.name}:<value>"

    def from_text(self, value: str, ipv6_prefix: int) -> str:
        """The identity an operator means by `value` under this kind (`identity_from_text`)."""
        if self.typed is not None:
            return self.typed(value, ipv6_prefix)
        return typed_value(self.name, value, self.normalizes)


class KeyKinds:
    """The key kinds by name, and the sets and messages derived from them, kept in step
    when a kind is added or removed."""

    def __init__(self, entries: Iterable[KeyKind]) -> None:
        self._entries: dict[str, KeyKind] = {}
        self._names: dict[str, str] = {}
        for entry in entries:
            self._entries[entry.name] = entry
        self._derive()

    def add(self, entry: KeyKind) -> None:
        """Declare a kind (or replace the one of that name)."""
        self._entries[entry.name] = entry
        self._derive()

    def remove(self, name: str) -> None:
        del self._entries[name]
        self._derive()

    def _derive(self) -> None:
        entries = self._entries.values()
        self._names = {alias: e.name for e in entries for alias in (e.name, *e.aliases)}
        #: The kinds that read `request.user`.
        self.reads_user = frozenset(e.name for e in entries if e.reads_user)
        #: The kinds that call a function of the user's (see `KeyKind.calls_code`).
        self.calls_code = frozenset(e.name for e in entries if e.calls_code)
        #: The kinds a replay log may be split by.
        self.splittable = frozenset(e.name for e in entries if e.splittable)
        #: The kinds whose identities may be `ip:` ones (an override may name a network).
        self.by_ip = frozenset(e.name for e in entries if "ip" in e.identity_kinds)
        typed = [e.usage for e in entries if e.usage]
        #: What to write, for messages: "use ip, user, ... or call:<dotted.path>".
        self.usage = "use " + (", ".join(typed[:-1]) + " or " + typed[-1] if len(typed) > 1
                               else "".join(typed))

    def __getitem__(self, name: str) -> KeyKind:
        return self._entries[name]

    def __iter__(self) -> Iterator[KeyKind]:
        return iter(self._entries.values())

    def find(self, written: str) -> KeyKind | None:
        """The kind a key's prefix names (any case, or an alias), or None."""
        name = self._names.get(written.lower())
        return None if name is None else self._entries[name]

    def help_text(self) -> str:
        """The admin's help for a policy's `key`."""
        return f"Who is counted: {self.usage.removeprefix('use ')}."


# -- readers --------------------------------------------------------------------------


def _http(request: Any) -> Any:
    """The Django request under a DRF one (whose META, GET and POST are the same)."""
    return getattr(request, "_request", request)


def _meta(request: Any) -> Any:
    meta = getattr(getattr(request, "_request", request), "META", None)
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


def _text(value: Any) -> str | None:
    """A read value as text, stripped; None when missing or blank."""
    if value is None:
        return None
    text = (value if isinstance(value, str) else str(value)).strip()
    return text or None


def _wire_text(value: Any) -> Any:
    """A header's value as the client wrote it: Django keeps its bytes as latin-1 text
    (PEP 3333, and the ASGI handler likewise); UTF-8 bytes are read as UTF-8."""
    if isinstance(value, str) and not value.isascii():
        with contextlib.suppress(UnicodeError):  # not latin-1 text, or not UTF-8 bytes
            return value.encode("latin-1").decode("utf-8")
    return value


def _read_ip(request: Any, arg: str, proxies: Proxies) -> str | None:
    return client_ip(_meta(request), proxies.trusted, proxies.ipv6_prefix, proxies.header)


def _ip_identity(request: Any, arg: str, proxies: Proxies) -> str | None:
    """The `ip` key's identity: an address (or an IPv6 network) is short printable ASCII
    and never begins with "h:", so it is counted as it is, never digested."""
    meta = getattr(getattr(request, "_request", request), "META", None)  # `_meta`, inlined:
    if type(meta) is not dict:  # every request asks it
        meta = _meta(request)
    address = client_ip(meta, proxies.trusted, proxies.ipv6_prefix, proxies.header)
    return None if address is None else f"ip:{address}"


def _read_user(request: Any, arg: str, proxies: Proxies) -> str | None:
    return user_pk(request)


def _read_user_or_ip(request: Any, arg: str, proxies: Proxies) -> str | None:
    pk = user_pk(request)
    if pk is not None:
        return bounded("user", pk)
    address = _read_ip(request, arg, proxies)
    return None if address is None else bounded("ip", address)


def _read_global(request: Any, arg: str, proxies: Proxies) -> str | None:
    return "global"


def _read_header(request: Any, arg: str, proxies: Proxies) -> str | None:
    return _text(_wire_text(_meta(request).get(meta_name(arg.lower()))))


def _read_query(request: Any, arg: str, proxies: Proxies) -> str | None:
    # Read from the raw query string, as `request.GET.get(arg)` would (the last value),
    # but without Django's field parsing: past DATA_UPLOAD_MAX_NUMBER_FIELDS it raises,
    # and a client must not be able to turn a policy off with `?a&a&a...`.
    return _text(query_value(_meta(request).get("QUERY_STRING", ""), arg))


def query_value(query: str, name: str) -> str | None:
    """The last value of the parameter `name` in a query string, or None. Django keeps
    the WSGI query string as latin-1 text (PEP 3333); its bytes are read as UTF-8."""
    if not query:
        return None
    with contextlib.suppress(UnicodeEncodeError):  # ASGI: already decoded text
        query = query.encode("latin-1").decode("utf-8", "replace")
    value = None
    for field in query.split("&"):
        if not field:
            continue
        key, _, raw = field.partition("=")
        if unquote_plus(key) == name:
            value = unquote_plus(raw)
    return value


def _read_post(request: Any, arg: str, proxies: Proxies) -> str | None:
    return _text(form_field(_http(request), arg))


#: The scopes of WebSocket policies (`ratelimits.channels`), named after the ASGI events
#: they count: a connection attempt, and a message received.
WEBSOCKET_CONNECT = "websocket.connect"
WEBSOCKET_RECEIVE = "websocket.receive"
WEBSOCKET_SCOPES = frozenset({WEBSOCKET_CONNECT, WEBSOCKET_RECEIVE})
#: Where a WebSocket message's request carries its connection's id, named as a server's
#: own environ keys are: no header can reach it (headers are HTTP_*).
CONNECTION_META = "ratelimits.connection"


def _read_connection(request: Any, arg: str, proxies: Proxies) -> str | None:
    """The WebSocket connection a message came on; None outside one (an HTTP request)."""
    return _text(_meta(request).get(CONNECTION_META))


def _read_call(request: Any, arg: str, proxies: Proxies) -> str | None:
    return _text(call_function(arg, request))


def _read_code(request: Any, arg: str, proxies: Proxies) -> str | None:
    return _text(call_reader(arg, request))


# -- an access log's identities --------------------------------------------------------


def _query_from_log(line: Logged, name: str) -> str | None:
    """What `request.GET.get(name)` gives (the last value), as a `query:` identity."""
    value = _text(query_value(line.query or "", name))
    value = normalized(value) if value else None
    return bounded("query", value) if value else None


KEY_KINDS = KeyKinds([
    KeyKind("ip", _ip_identity, "ip", hashed=False, from_log=lambda line, arg: line.ip,
            splittable=True,
            example="ip:203.0.113.7 or ip:203.0.113.0/24", typed=typed_ip),
    KeyKind("user", _read_user, "user", reads_user=True, from_log=lambda line, arg: line.user,
            splittable=True, example="user:42", names_account=True),
    KeyKind("user_or_ip", _read_user_or_ip, "user_or_ip", hashed=False, reads_user=True,
            from_log=lambda line, arg: line.user or line.ip, splittable=True,
            example="user:42 or ip:203.0.113.0/24", counts_as=("user", "ip"),
            typed=typed_user_or_ip),
    KeyKind("global", _read_global, "global", hashed=False,
            from_log=lambda line, arg: "global", example="tier:<name>", typed=typed_global),
    KeyKind("header", _read_header, "header:<Name>", header_name,
            "header: needs a header name, e.g. header:X-Api-Key", client_sent=True,
            not_in_log="an access log does not record request headers", normalizes=True),
    KeyKind("query", _read_query, "query:<name>", parameter_name,
            "query: needs a query parameter name, e.g. query:api_key", client_sent=True,
            from_log=_query_from_log, log_query=True, aliases=("get",), normalizes=True),
    KeyKind("post", _read_post, "post:<field>", parameter_name,
            "post: needs a form field name, e.g. post:username", client_sent=True,
            normalizes=True, names_account=True),
    KeyKind("call", _read_call, "call:<dotted.path>", dotted_path,
            "call: needs a dotted path to a function, e.g. call:myapp.keys.tenant",
            calls_code=True, not_in_log="a key function needs the live request"),
    # Each WebSocket connection apart, for the messages it carries (`ratelimits.channels`).
    KeyKind("connection", _read_connection, "connection", example="tier:<name>",
            not_in_log="an access log does not record WebSocket connections"),
    # A function given to `@ratelimit(key=...)` in code, by its declaration's name.
    KeyKind("code", _read_code, "", code_name,
            "code: needs the name of a limit declared in code with a key function",
            calls_code=True),
])


def parse_key(spec: str) -> KeySpec:
    """Parse a policy `key` such as `ip` or `header:X-Api-Key`; ValueError says what to fix."""
    if not isinstance(spec, str):
        raise ValueError(f"key must be text, got {type(spec).__name__}; {KEY_KINDS.usage}")
    text = spec.strip()
    if not text:
        raise ValueError(f"key is empty; {KEY_KINDS.usage}")
    written, sep, arg = text.partition(":")
    entry = KEY_KINDS.find(written)
    if entry is None:
        raise ValueError(f"unknown key {text!r}; {KEY_KINDS.usage}")
    if entry.check is None:
        if sep:
            raise ValueError(f"key {entry.name!r} takes no argument; write just {entry.name}")
        return KeySpec(entry.name)
    problem = entry.check(arg) if arg else entry.missing
    if problem:
        raise ValueError(problem)
    return KeySpec(entry.name, arg)


@dataclass(frozen=True)
class KeySpec:
    """A parsed policy key: `kind` ("ip", "header", ...) and its `arg` (or "")."""

    kind: str
    arg: str = ""
    #: The kind's row of `KEY_KINDS`.
    entry: KeyKind = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entry", KEY_KINDS[self.kind])

    def identify(
        self,
        request: Any,
        *,
        trusted_proxies: Sequence[Network] = (),
        ipv6_prefix: int = 64,
        proxy_header: str = DEFAULT_PROXY_HEADER,
    ) -> str | None:
        """The client identity for this key, or None when the policy does not apply."""
        return self.read(request, Proxies(trusted_proxies, ipv6_prefix, proxy_header))

    def read(self, request: Any, proxies: Proxies) -> str | None:
        """`identify()`, with how the client address is read given as one value."""
        entry = self.entry
        try:
            value = entry.read(request, self.arg, proxies)
        except IdentityError:
            raise
        except Exception as exc:
            # One policy's unreadable key is that policy's failure (its on_error decides),
            # never an error that un-decides the request's other policies.
            raise IdentityError(f"reading the key {self.kind} raised "
                                f"{type(exc).__name__}: {exc}") from exc
        if value is None or not entry.hashed:
            return value
        if entry.normalizes:
            value = normalized(value)
            if value is None:
                return None
        return bounded(entry.name, value)


def identity_from_text(kind: str, value: str, ipv6_prefix: int = 64) -> str:
    """The identity a request would get under a `kind` key, from what an operator typed:
    an identity as logs and the admin show it ("ip:203.0.113.7", "user:42", "ip:h:...")
    or a bare value ("2001:db8::1" counts as its /64, as requests do). Raises ValueError
    with a message for the operator when the value cannot be such an identity."""
    return KEY_KINDS[kind].from_text(value, ipv6_prefix)
