"""A `RATELIMITS["REDIS_URL"]` read and checked: one server, a socket, or a cluster's seeds.

Each deployment mode of `ratelimits.engine.deployments` names its parser here; the
messages say what to fix and never show the password.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit, urlunsplit

__all__ = [
    "LIMITER_OWNED_OPTIONS",
    "REDIS_URL_EXAMPLE",
    "RedisURL",
    "parse_cluster",
    "parse_server",
    "parse_socket",
    "redact_url",
]

REDIS_URL_EXAMPLE = "'redis://localhost:6379/0'"

#: Valkey's schemes, as redis-py reads them: Valkey speaks Redis's protocol, and redis-py
#: takes only redis://, rediss:// and unix://.
_AS_REDIS = {"valkey": "redis", "valkeys": "rediss"}


def as_redis(scheme: str) -> str:
    """The redis-py scheme of `scheme` ("valkeys+cluster" -> "rediss+cluster")."""
    base, plus, mode = scheme.partition("+")
    return _AS_REDIS.get(base, base) + plus + mode

#: Connection options the limiter sets itself on every kind of store: a URL may not loosen
#: them, since a limiter on every request must answer within its timeouts or step aside.
LIMITER_OWNED_OPTIONS = {
    "socket_timeout": "set RATELIMITS['SOCKET_TIMEOUT'] instead",
    "socket_connect_timeout": "set RATELIMITS['CONNECT_TIMEOUT'] instead",
    "retry_on_timeout": "the limiter never retries: a policy's on_error decides instead",
    "retry_on_error": "the limiter never retries: a policy's on_error decides instead",
    "health_check_interval": "the limiter's short timeouts detect a dead connection",
}


@dataclass(frozen=True)
class RedisURL:
    """A checked `RATELIMITS["REDIS_URL"]`: one server, a socket, or a cluster's seeds.

    `options` are redis-py's connection keyword arguments (credentials, db, TLS, socket
    path) as the URL gives them; the limiter adds its own timeouts when it connects.
    """

    url: str = field(repr=False)
    kind: str  # the name of its `Deployment`: "server", "socket" or "cluster"
    nodes: tuple[tuple[str, int], ...]  # a cluster's seed nodes; () otherwise
    options: Mapping[str, Any] = field(repr=False)

    @property
    def shown(self) -> str:
        """The URL with its password hidden, for messages and logs."""
        return redact_url(self.url)


def redact_url(url: str) -> str:
    """`url` with the password of its user part replaced by ***."""
    return re.sub(r"(://[^/@?#]*?:)[^/@?#]*@", r"\1***@", url)


def _connection_options_allowed(connection_class: type) -> frozenset[str]:
    names: set[str] = {"max_connections"}
    for klass in connection_class.__mro__:
        if "__init__" in vars(klass):
            names.update(inspect.signature(klass.__init__).parameters)  # type: ignore[misc]
    return frozenset(names - {"self", "args", "kwargs"})


def _url_options(url: str, shown: str, query: str, cluster: bool) -> dict[str, Any]:
    """redis-py's keyword arguments for one URL, refusing options it would trip on later."""
    from redis.connection import Connection, parse_url

    try:
        options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"{shown!r}: {exc}") from None
    allowed = _connection_options_allowed(options.get("connection_class", Connection))
    if cluster:
        from redis.cluster import REDIS_ALLOWED_KEYS

        allowed &= frozenset(REDIS_ALLOWED_KEYS)  # RedisCluster drops any other silently
    for name in parse_qs(query, keep_blank_values=True):
        if name in LIMITER_OWNED_OPTIONS:
            raise ValueError(
                f"{shown!r} sets {name}, which the limiter owns: remove it from the URL "
                f"({LIMITER_OWNED_OPTIONS[name]})"
            )
        if name not in allowed or name.startswith(("orig_", "maint")):
            raise ValueError(
                f"{shown!r} has the option {name!r}, which redis-py does not take for this "
                "scheme; check its spelling (e.g. ssl_ca_certs, ssl_cert_reqs, db)"
            )
    return options


def _seed_node(node: str, shown: str) -> tuple[str, int]:
    if not node.strip():
        raise ValueError(
            f"{shown!r} has an empty node in its list: separate host:port pairs with "
            "single commas, e.g. 'redis+cluster://10.0.0.1:7000,10.0.0.2:7000'"
        )
    split = urlsplit(f"//{node}")
    host = split.hostname
    port = _port(split, node, shown)
    if not host:
        raise ValueError(f"{shown!r} has the node {node!r} without a host")
    return host, port or 6379


def _port(split: SplitResult, where: str, shown: str) -> int | None:
    try:
        port = split.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(
            f"{shown!r} has a bad port in {where!r}: a port is a number from 1 to 65535"
        )
    return port


def _database_path(split: SplitResult, shown: str) -> None:
    if split.path not in ("", "/") and not re.fullmatch(r"/\d+/?", unquote(split.path)):
        raise ValueError(
            f"{shown!r} has the path {split.path!r}: the path is the database number, "
            "e.g. /0, or nothing"
        )


def parse_server(value: str, shown: str, scheme: str, rest: str) -> RedisURL:
    scheme = as_redis(scheme)
    split = urlsplit(f"{scheme}://{rest}")
    _database_path(split, shown)
    if not split.hostname:
        raise ValueError(f"{shown!r} names no host: write e.g. {REDIS_URL_EXAMPLE}")
    _port(split, split.netloc.rpartition("@")[2], shown)
    options = _url_options(f"{scheme}://{rest}", shown, split.query, cluster=False)
    return RedisURL(value, "server", (), MappingProxyType(options))


def parse_socket(value: str, shown: str, scheme: str, rest: str) -> RedisURL:
    split = urlsplit(f"{scheme}://{rest}")
    if not split.path or split.path == "/":
        raise ValueError(
            f"{shown!r} names no socket: write e.g. 'unix:///run/redis/redis.sock?db=0'"
        )
    options = _url_options(f"{scheme}://{rest}", shown, split.query, cluster=False)
    return RedisURL(value, "socket", (), MappingProxyType(options))


def parse_cluster(value: str, shown: str, scheme: str, rest: str) -> RedisURL:
    base = as_redis(scheme).removesuffix("+cluster")
    split = urlsplit(f"{base}://{rest}")
    _database_path(split, shown)
    userinfo, at, hosts = split.netloc.rpartition("@")
    if not hosts.strip():
        raise ValueError(
            f"{shown!r} lists no nodes: write one or more host:port seeds, e.g. "
            "'redis+cluster://10.0.0.1:7000,10.0.0.2:7000'"
        )
    nodes = tuple(_seed_node(node, shown) for node in hosts.split(","))
    first = hosts.split(",")[0]
    single = urlunsplit((base, f"{userinfo}{at}{first}", split.path, split.query, ""))
    options = _url_options(single, shown, split.query, cluster=True)
    if options.get("db", 0) != 0:
        raise ValueError(f"{shown!r} asks for database {options['db']}: a cluster has only 0")
    for name in ("host", "port", "db", "connection_class"):
        options.pop(name, None)
    if base == "rediss":
        options["ssl"] = True
    return RedisURL(value, "cluster", nodes, MappingProxyType(options))
