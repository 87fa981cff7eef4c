"""Who is the client: the client IP behind trusted proxies, the user, a key function's
value, values compared as Django's login compares a username, and identities bounded for
keys and logs. The key kinds built on these readers
are declared in `keykinds`.

Nothing here imports Django: requests are read through duck typing (`META`, `GET`,
`user`), so both Django `HttpRequest` and DRF `Request` objects work.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import ipaddress
import json
import logging
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ratelimits import runtime

__all__ = [
    "DEFAULT_PROXY_HEADER",
    "IdentityError",
    "bounded",
    "call_function",
    "call_reader",
    "client_ip",
    "display_identity",
    "form_field",
    "is_header_name",
    "meta_name",
    "normalized",
    "parse_trusted_proxies",
    "register_reader",
    "user_pk",
]

logger = logging.getLogger("ratelimits")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_IDENTITY = 200
_MAX_HOPS = 64
_MAX_HEADER = 8192  # read from the right: the hops nearest to us are the trustworthy ones
_MAX_DISPLAY = 80

_TOKEN = re.compile(r"[!#$%&'*+\-.^`|~0-9A-Za-z]+")  # RFC 9110 token, minus '_' (see below)
# Django does not give these two the HTTP_ prefix in META.
_UNPREFIXED = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})
# The header a trusted proxy names the client in: what almost every proxy sets.
DEFAULT_PROXY_HEADER = "x-forwarded-for"


class IdentityError(Exception):
    """A key could not identify the client (e.g. a `call:` function raised)."""


def is_header_name(name: str) -> bool:
    """An HTTP header name Django can tell apart in META: a token without '_'."""
    return bool(_TOKEN.fullmatch(name))


def parse_trusted_proxies(values: Iterable[str]) -> list[Network]:
    """Each item an IP address or CIDR network (host bits allowed); ValueError names the bad one."""
    networks = []
    for item in values:
        try:
            if not isinstance(item, str):
                raise ValueError
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"entry {item!r} is not an IP address or CIDR network; "
                "write e.g. '10.0.0.1' or '10.0.0.0/8'"
            ) from None
    return networks


def client_ip(
    meta: Mapping[str, Any],
    trusted_proxies: Sequence[Network],
    ipv6_prefix: int = 64,
    proxy_header: str = DEFAULT_PROXY_HEADER,
) -> str | None:
    """The client address (IPv6 as its /`ipv6_prefix` network); None when there is none.

    Behind a trusted peer, only `proxy_header` is read: "forwarded" (RFC 7239 `for=`),
    or any header holding comma-separated addresses ("x-forwarded-for", "x-real-ip").
    The answer for a peer and header seen lately is remembered (`_clients`): a client's
    next request reads it with one lookup.
    """
    peer = meta.get("REMOTE_ADDR")
    name = proxy_header.lower()
    value = meta.get(meta_name(name))
    if (type(trusted_proxies) is not tuple or not isinstance(peer, str)
            or (value is not None and (not isinstance(value, str)
                                       or len(value) > _REMEMBERED_HEADER))):
        return _client_ip(meta, peer, name, value, trusted_proxies, ipv6_prefix)
    if trusted_proxies is not _clients.trusted:
        _clients.start(trusted_proxies)  # other settings: what was read no longer holds
    # the tuple's id too: a thread still reading under the settings before keeps its
    # answer apart from those read under the new ones
    key = (peer, value, ipv6_prefix, name, id(trusted_proxies))
    found = _clients.get(key)
    if found is None:
        address = _client_ip(meta, peer, name, value, trusted_proxies, ipv6_prefix)
        if len(_clients) >= CLIENTS_KEPT:
            _clients.clear()  # many clients: start again rather than grow
        _clients[key] = (address, _proxied(peer, trusted_proxies))
        return address
    address, proxied = found
    if proxied and not _other_header.warned and name in _PAIRED and _PAIRED_META[name] in meta:
        # the warning is about this request's headers: asked as when read afresh
        _other_header.notice(meta, _parse_address(peer), name)  # type: ignore[arg-type]
    return address


def _proxied(peer: str, trusted_proxies: Sequence[Network]) -> bool:
    current = _parse_address(peer)
    return current is not None and _is_trusted(current, trusted_proxies)


class _Clients(dict[tuple[Any, ...], tuple[str | None, bool]]):
    """(peer, proxy header's value, IPv6 prefix, header name, the trusted proxies' id) ->
    the client address read from them, and whether the peer is a trusted proxy, for the
    clients seen lately under the trusted proxies `trusted` (compared by identity: the
    settings' own tuple)."""

    trusted: Any = None

    def start(self, trusted: Any) -> None:
        self.clear()
        self.trusted = trusted


_clients = _Clients()
#: At most this many are remembered; a header longer than `_REMEMBERED_HEADER` never is.
CLIENTS_KEPT = 4_096
_REMEMBERED_HEADER = 256
runtime.on_reset(_clients.clear)


def _client_ip(meta: Mapping[str, Any], peer: Any, name: str, value: Any,
               trusted_proxies: Sequence[Network], ipv6_prefix: int) -> str | None:
    """`client_ip`, read afresh."""
    current = _parse_address(peer)
    if current is None:
        return None
    if _is_trusted(current, trusted_proxies):
        # Only a trusted peer may speak for someone else, and only in the header it sets:
        # a header the proxy passes through untouched is whatever the client wrote.
        text = value if isinstance(value, str) else ""
        if name == "forwarded":
            hops = (_forwarded_for(e) for e in _rightmost(text))
        else:
            hops = (_parse_address(hop) for hop in _rightmost(text))
        if name in _PAIRED:
            _other_header.notice(meta, current, name)
        for hop in hops:
            if hop is None:
                break  # garbage or an obfuscated hop: keep the last one we could read
            current = hop
            if not _is_trusted(hop, trusted_proxies):
                break
    return _format(current, ipv6_prefix)


@functools.lru_cache(maxsize=256)
def meta_name(header: str) -> str:
    """The META key of an HTTP header name ("x-api-key" -> "HTTP_X_API_KEY")."""
    name = header.upper().replace("-", "_")
    return name if name in _UNPREFIXED else "HTTP_" + name


_PAIRED = {"x-forwarded-for": "forwarded", "forwarded": "x-forwarded-for"}
_PAIRED_META = {"x-forwarded-for": "HTTP_FORWARDED", "forwarded": "HTTP_X_FORWARDED_FOR"}
_DISPLAY_NAME = {"x-forwarded-for": "X-Forwarded-For", "forwarded": "Forwarded"}


class _OtherHeaderWarning:
    """Warn once per process when a trusted proxy sends Forwarded and X-Forwarded-For is
    read, or the other way round.

    Only the configured header is read. If the proxy in fact sets the other one, the header
    read is the client's own (a fresh identity per request) or absent (every client counted
    as the proxy). A system check cannot see requests, so this is logged when it happens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.warned = False

    def notice(self, meta: Mapping[str, Any], peer: Address, read: str) -> None:
        if self.warned:
            return
        other = _PAIRED[read]
        ignored = meta.get(meta_name(other))
        if not (isinstance(ignored, str) and ignored.strip()):
            return
        with self._lock:
            if self.warned:
                return
            self.warned = True
        used = meta.get(meta_name(read))
        logger.warning(
            "ratelimits: trusted proxy %s sent %s: %s, which is not read: "
            "RATELIMITS['PROXY_HEADER'] is %r (%s: %s). If your proxy sets %s, set "
            "PROXY_HEADER to %r; if not, the client wrote it and ignoring it is right. "
            "Logged once per process.",
            peer,
            _DISPLAY_NAME[other],
            display_identity(ignored),
            read,
            _DISPLAY_NAME[read],
            display_identity(used) if isinstance(used, str) and used.strip() else "absent",
            _DISPLAY_NAME[other],
            other,
        )

    def reset(self) -> None:
        self.warned = False


_other_header = _OtherHeaderWarning()
runtime.on_reset(_other_header.reset)


def reset_proxy_warning() -> None:
    """Let the other-header warning be logged again (tests)."""
    _other_header.reset()


def _rightmost(header: str) -> list[str]:
    """The comma-separated items of a header, right-most first, bounded."""
    cut = len(header) > _MAX_HEADER
    items = header[-_MAX_HEADER:].split(",")
    if cut:
        items = items[1:]  # the left-most piece was cut mid-value
    return items[::-1][:_MAX_HOPS]


def _parse_address(value: Any) -> Address | None:
    """An address from `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`; None if anything else."""
    if not isinstance(value, str):
        return None
    if len(value) > 128:  # not remembered: a header's garbage must not fill the cache
        return _parse_text.__wrapped__(value)
    return _parse_text(value)


@functools.lru_cache(maxsize=4_096)  # recent peers: a client's address is parsed once
def _parse_text(value: str) -> Address | None:
    text = value.strip()
    if not text or len(text) > 64:
        return None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        if not port.isdigit():
            return None
    else:
        host = text
    host = host.split("%", 1)[0]  # an IPv6 zone id names our interface, not the client
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _forwarded_for(element: str) -> Address | None:
    """The `for=` node of one RFC 7239 element; None when missing, obfuscated or unknown."""
    for pair in element.split(";"):
        name, sep, value = pair.partition("=")
        if sep and name.strip().lower() == "for":
            node = value.strip()
            if len(node) >= 2 and node[0] == node[-1] == '"':
                node = node[1:-1].replace("\\", "")
            # "unknown" and "_hidden" do not parse as addresses, so they end the walk.
            return _parse_address(node)
    return None


def _is_trusted(address: Address, networks: Sequence[Network]) -> bool:
    return any(address in network for network in networks)


@functools.lru_cache(maxsize=4_096)
def _format(address: Address, ipv6_prefix: int) -> str:
    if isinstance(address, ipaddress.IPv4Address):
        return str(address)
    # One subscriber usually holds a whole /64: counting single addresses would let them rotate.
    network = ipaddress.IPv6Network((address, ipv6_prefix), strict=False)
    return f"{network.network_address}/{ipv6_prefix}"


def user_pk(request: Any) -> str | None:
    """The authenticated user's pk as text (what a `user` key counts by), or None."""
    try:
        user = getattr(request, "user", None)
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        pk = getattr(user, "pk", None)
    except Exception as exc:  # an authentication backend failing is not ours to crash on
        raise IdentityError(f"reading request.user raised {type(exc).__name__}: {exc}") from exc
    if pk is None:
        raise IdentityError("the authenticated user has no pk to count it by")
    return str(pk)


def form_field(http: Any, name: str) -> Any:
    """A field of the request's body (`request.POST`, or a JSON object's member when the
    body is JSON); None without one. A body Django refuses to read (too many fields,
    larger than DATA_UPLOAD_MAX_MEMORY_SIZE, read already as a stream) identifies no one
    and is logged as such: the policy is not decided for this request."""
    if getattr(http, "method", None) != "POST":
        return None
    try:
        if _is_json(http):
            return _json_member(http.body, name)
        form = http.POST
        return form.get(name)
    except Exception as exc:
        raise IdentityError(f"the request body could not be read: {type(exc).__name__}: {exc}"
                            ) from exc


def _is_json(http: Any) -> bool:
    """Whether the body is JSON by its content type (`application/json`, `…+json`), as
    a JSON parser (DRF's) takes it; Django leaves such a body out of `request.POST`."""
    meta = getattr(http, "META", None)
    value = meta.get("CONTENT_TYPE") if isinstance(meta, Mapping) else None
    if not isinstance(value, str):
        return False
    media = value.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def _json_member(body: bytes, name: str) -> str | None:
    """The member `name` of a JSON body's top-level object, when it is text or a number
    (a serializer's CharField takes both); None for anything else or a malformed body.

    `request.body` is bounded by Django (DATA_UPLOAD_MAX_MEMORY_SIZE) and kept: the view
    reads the same bytes again (DRF parses them from there once they have been read).
    """
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # malformed, not UTF-8/16/32, or nested too deep
        return None
    value = document.get(name) if isinstance(document, dict) else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return value if isinstance(value, str) else str(value)


#: The key functions given in code (`@ratelimit(key=function)`, the compat layers), by
#: the name of their declaration: what a `code:<name>` key calls with the request.
_readers: dict[str, Callable[[Any], Any]] = {}


def register_reader(name: str, reader: Callable[[Any], Any]) -> None:
    """Make `code:<name>` count clients by `reader(request)` (a value, or None when the
    limit does not apply to this request)."""
    _readers[name] = reader


def call_reader(name: str, request: Any) -> Any:
    """What the key function declared in code as `name` gives for `request`."""
    reader = _readers.get(name)
    if reader is None:
        raise IdentityError(
            f"code:{name} names no key function: the limit {name!r} is declared in code "
            "that this process has not imported"
        )
    try:
        value = reader(request)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a key function never stops the worker
        raise IdentityError(f"the key function of {name!r} raised {type(exc).__name__}: "
                            f"{exc}") from exc
    return value if value is None or isinstance(value, str) else str(value)


def call_function(path: str, request: Any) -> Any:
    """What the function at the dotted `path` (a `call:` key) gives for `request`."""
    function = _load(path)
    try:
        value = function(request)
        return value if value is None or isinstance(value, str) else str(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a key function never stops the worker
        raise IdentityError(f"{path} raised {type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=256)
def _load_cached(path: str) -> Callable[[Any], Any]:
    module, _, name = path.rpartition(".")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"{name} is a {type(function).__name__}, not a function")
    return function  # type: ignore[no-any-return]  # any callable of the user's


runtime.on_reset(_load_cached.cache_clear)  # a test may replace the function a path names


def _load(path: str) -> Callable[[Any], Any]:
    """Import lazily (not at parse time) and once; failures are retried on the next call."""
    try:
        return _load_cached(path)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a module that exits as it is imported, too
        raise IdentityError(
            f"call:{path} could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc


def bounded(kind: str, value: str) -> str:
    """`kind:value`, or `kind:h:<digest>` when the value is long or not printable ASCII."""
    identity = f"{kind}:{value}"
    if (
        len(identity) > MAX_IDENTITY
        or not (identity.isascii() and identity.isprintable())
        or value.startswith("h:")  # a literal "h:..." must not collide with a digest
    ):
        raw = value.encode("utf-8", "surrogatepass")
        return f"{kind}:h:{hashlib.blake2b(raw, digest_size=16).hexdigest()}"
    return identity


#: Longer values are not normalized: Django's `UsernameField` leaves a value past the
#: field's max_length as it is (the form refuses it), and NFKC's cost grows with the text.
_MAX_NORMALIZED = 1024


def normalized(text: str) -> str | None:
    """`text` as Django's login finds the account: `AuthenticationForm`'s username field
    strips it and NFKC-normalizes it (a name typed in fullwidth or mathematical letters is
    the plain one), as `create_user()` stores it; then stripped again (NFKC can make a
    space). Case is kept, as Django's default user model compares it. None when nothing
    is left; ASCII text is returned unchanged."""
    if text.isascii() or len(text) > _MAX_NORMALIZED:
        return text
    return unicodedata.normalize("NFKC", text).strip() or None


def display_identity(identity: str) -> str:
    """A log-safe form: printable, control characters escaped, at most 80 characters."""
    text = identity if isinstance(identity, str) else str(identity)
    if len(text) <= _MAX_DISPLAY and text.isprintable():  # the usual identity, as it is
        return text
    head = text[: _MAX_DISPLAY + 1]
    shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in head)
    if len(shown) > _MAX_DISPLAY or len(text) > len(head):
        return shown[: _MAX_DISPLAY - 1] + "…"
    return shown
