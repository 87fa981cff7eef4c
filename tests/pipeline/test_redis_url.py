"""RATELIMITS["REDIS_URL"]: the engine's own Redis, instead of the CACHE alias.

Each scheme is driven against a real server of its own (a password on db 3, a unix
socket, TLS with a client certificate, a Redis Cluster), and each malformed URL is
refused with a message that says what to fix, without ever echoing a password.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisClusterException

from ratelimits.conf import build_config
from ratelimits.engine import deployments
from ratelimits.pipeline.engines import get_engine, is_shared
from tests.pipeline.test_promises_store import (  # noqa: F401  (fixtures)
    PREFIX,
    certificates,
    tls_options,
    tls_redis,
)
from tests.redis_cluster import RedisCluster
from tests.redis_server import STORE, free_port, server_binary

PASSWORD = "url-s3cret"


def use_url(settings, url: str, **more) -> None:
    """REDIS_URL set, and the CACHE alias pointed at a non-Redis cache: only the URL can
    make these decisions shared."""
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "local", "REDIS_URL": url, **more}


def prefixed_keys(client: redis.Redis) -> set[str]:
    return {k.decode() for k in client.keys(f"{PREFIX}*")}


def assert_limiter_options(kwargs, socket_timeout: float | None = None) -> None:
    from ratelimits.conf import SETTINGS

    assert kwargs["socket_timeout"] == (socket_timeout or SETTINGS["SOCKET_TIMEOUT"].default)
    # the suite's settings give a connect a second (tests/settings.py), not the default
    assert kwargs["socket_connect_timeout"] == django_settings.RATELIMITS["CONNECT_TIMEOUT"]
    assert kwargs["retry"].get_retries() == 0
    assert not kwargs.get("retry_on_timeout")


# -- malformed URLs are refused, saying what to fix ----------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (6379, "must be a URL such as 'redis://localhost:6379/0'"),
        ("", "must be a URL such as"),
        ("localhost:6379", "has no scheme: use redis://"),
        ("http://localhost:6379", "has the scheme 'http': use redis://"),
        ("redis://", "names no host"),
        ("redis://localhost:63x9/0", "a port is a number from 1 to 65535"),
        ("redis://localhost:70000/0", "a port is a number from 1 to 65535"),
        ("redis://localhost:6379/cache", "the path is the database number"),
        ("redis://localhost?db=three", "Invalid value for 'db'"),
        ("unix://", "names no socket"),
        ("redis+cluster://", "lists no nodes"),
        ("redis+cluster://a:7000,,b:7000", "has an empty node in its list"),
        ("redis+cluster://a:7000,b:port", "bad port in 'b:port'"),
        ("redis+cluster://a:7000/2", "a cluster has only 0"),
        ("redis://localhost?socket_timeout=5", "set RATELIMITS['SOCKET_TIMEOUT'] instead"),
        ("redis://localhost?retry_on_timeout=yes", "the limiter never retries"),
        ("rediss://localhost?ssl_ca_cert=/ca.pem", "check its spelling"),
        ("redis://localhost?ssl_cert_reqs=required", "does not take for this scheme"),
    ],
)
def test_a_malformed_url_is_refused_saying_what_to_fix(url, says):
    with pytest.raises(ImproperlyConfigured) as info:
        build_config({"REDIS_URL": url})
    message = str(info.value)
    assert message.startswith("RATELIMITS['REDIS_URL']") and says in message


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2@host",
        "redis://:hunter2@host:bad/0",
        "redis+cluster://:hunter2@a:1,,b:2",
        "redis://:hunter2@localhost?socket_timeout=5",
    ],
)
def test_a_refused_url_never_shows_its_password(url):
    with pytest.raises(ImproperlyConfigured) as info:
        build_config({"REDIS_URL": url})
    assert "hunter2" not in str(info.value) and ":***@" in str(info.value)


def test_good_urls_are_read_as_redis_py_reads_them():
    server = build_config({"REDIS_URL": "rediss://u:pw@h:7001/3?ssl_cert_reqs=none"})
    url = server["REDIS_URL"]
    assert (url.kind, url.options["db"], url.options["port"]) == ("server", 3, 7001)
    assert (url.options["username"], url.options["password"]) == ("u", "pw")
    assert issubclass(url.options["connection_class"], redis.SSLConnection)
    assert "pw" not in repr(url)  # settings are printed by debug pages and shells

    socket = build_config({"REDIS_URL": "unix:///run/redis.sock?db=2"})["REDIS_URL"]
    assert (socket.kind, socket.options["path"], socket.options["db"]) == (
        "socket", "/run/redis.sock", 2
    )

    cluster = build_config({"REDIS_URL": "rediss+cluster://:pw@10.0.0.1:7000,[::1],n"})
    url = cluster["REDIS_URL"]
    assert url.kind == "cluster"
    assert url.nodes == (("10.0.0.1", 7000), ("::1", 6379), ("n", 6379))
    assert dict(url.options) == {"password": "pw", "ssl": True}


@pytest.mark.parametrize(("valkey", "redis_twin"), [
    ("valkey://u:pw@h:7001/3", "redis://u:pw@h:7001/3"),
    ("valkeys://h:7001/3?ssl_cert_reqs=none", "rediss://h:7001/3?ssl_cert_reqs=none"),
    ("VALKEY://h", "redis://h"),
    ("valkey+cluster://:pw@10.0.0.1:7000,n", "redis+cluster://:pw@10.0.0.1:7000,n"),
    ("valkeys+cluster://10.0.0.1:7000", "rediss+cluster://10.0.0.1:7000"),
])
def test_a_valkey_url_reads_as_its_redis_twin(valkey, redis_twin):
    read, twin = (build_config({"REDIS_URL": u})["REDIS_URL"] for u in (valkey, redis_twin))
    assert (read.kind, read.nodes, dict(read.options)) == (
        twin.kind, twin.nodes, dict(twin.options))
    assert read.url == valkey  # as the operator wrote it, for messages


def test_a_bad_valkey_url_is_refused_in_its_own_words():
    with pytest.raises(ImproperlyConfigured, match="'valkey://' names no host"):
        build_config({"REDIS_URL": "valkey://"})


# -- one server with a password, on db 3 ---------------------------------------------------


@pytest.fixture
def locked_server(private_redis):
    admin = redis.Redis(port=private_redis.port)
    admin.config_set("requirepass", PASSWORD)
    admin.close()
    return private_redis


def test_decisions_land_in_the_urls_database_not_the_caches(
    client, make_policy, locked_server, settings, redis_client
):
    # the scheme of the server the suite runs on: valkey:// on Valkey (`make test-valkey`)
    use_url(settings, f"{STORE}://:{PASSWORD}@127.0.0.1:{locked_server.port}/3")
    assert is_shared()
    kwargs = get_engine().client.connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["db"], kwargs["password"]) == (locked_server.port, 3, PASSWORD)
    assert_limiter_options(kwargs)

    # `deny`: a limiter that could not log in or reach db 3 would answer 503
    make_policy(name="on-url", limit=2, path="/hello/", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]

    db3 = redis.Redis(port=locked_server.port, password=PASSWORD, db=3)
    assert f"{PREFIX}version" in prefixed_keys(db3) and len(prefixed_keys(db3)) >= 2
    assert redis.Redis(port=locked_server.port, password=PASSWORD, db=0).dbsize() == 0
    assert prefixed_keys(redis_client) == set()  # the cache's own Redis saw none of it


def test_a_wrong_password_in_the_url_is_an_outage_not_an_admission(
    client, make_policy, locked_server, settings
):
    """The other side of the test above: this server does refuse a wrong password."""
    use_url(settings, f"redis://:wrong@127.0.0.1:{locked_server.port}/3")
    make_policy(name="locked-out", limit=2, path="/hello/", on_error="deny")
    assert client.get("/hello/").status_code == 503


def ratelimits_check_ids() -> set[str]:
    return {m.id for m in checks.run_checks() if (m.id or "").startswith("ratelimits.")}


def test_the_url_wins_over_the_cache_alias_for_the_system_checks(settings):
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "local"}
    assert ratelimits_check_ids() == {"ratelimits.W001"}  # a per-process cache ...
    use_url(settings, "redis://127.0.0.1:1/0")
    assert ratelimits_check_ids() == set()  # ... is not used: the URL's Redis is shared
    settings.RATELIMITS = {**settings.RATELIMITS, "CACHE": "no-such-alias"}
    assert ratelimits_check_ids() == set()


# -- a unix socket -------------------------------------------------------------------------


@pytest.fixture
def socket_server(tmp_path_factory):
    """A redis-server listening on a unix socket only (`--port 0`)."""
    binary = server_binary()
    workdir = tmp_path_factory.mktemp("sock")
    path = workdir / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    direct = redis.Redis(unix_socket_path=str(path), socket_timeout=1)
    deadline = time.monotonic() + 10
    while True:
        try:
            direct.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server did not open its socket {path} in 10 s")
            time.sleep(0.02)
    yield path
    proc.kill()
    proc.wait(10)


def test_decisions_land_on_the_unix_socket(client, make_policy, socket_server, settings):
    use_url(settings, f"unix://{socket_server}?db=2")
    pool = get_engine().client.connection_pool
    assert issubclass(pool.connection_class, redis.UnixDomainSocketConnection)
    assert_limiter_options(pool.connection_kwargs)

    make_policy(name="on-socket", limit=2, path="/hello/", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    direct = redis.Redis(unix_socket_path=str(socket_server), db=2)
    assert f"{PREFIX}version" in prefixed_keys(direct) and len(prefixed_keys(direct)) >= 2


# -- TLS -----------------------------------------------------------------------------------


def test_decisions_land_on_the_tls_server_with_the_urls_certificates(
    client, make_policy, tls_redis, certificates, settings  # noqa: F811
):
    server, tls_port = tls_redis
    options = tls_options(certificates)
    query = "&".join(f"{k}={v}" for k, v in options.items())
    use_url(settings, f"{STORE}s://127.0.0.1:{tls_port}/2?{query}")
    pool = get_engine().client.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)
    assert {k: pool.connection_kwargs[k] for k in options} == options
    assert_limiter_options(pool.connection_kwargs)

    make_policy(name="on-tls", limit=2, path="/hello/", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    direct = redis.Redis(port=server.port, db=2)  # its plain port, to read the keys back
    assert f"{PREFIX}version" in prefixed_keys(direct) and len(prefixed_keys(direct)) >= 2


def test_decisions_land_on_a_tls_cluster_with_the_urls_certificates(
    client, make_policy, certificates, settings  # noqa: F811
):
    """rediss+cluster://: every node reached over TLS with the URL's certificates (the
    nodes want a client certificate), the limiter's timeouts kept, decisions on the cluster."""
    from ratelimits.engine.cluster import ClusterEngine

    tls_cluster = RedisCluster(replicas=0, tls=certificates).start()
    try:
        options = tls_options(certificates)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        use_url(settings, f"{tls_cluster.tls_url}?{query}")
        engine = get_engine().store
        assert isinstance(engine, ClusterEngine)
        primaries = engine.client.get_primaries()
        assert {n.port for n in primaries} == set(tls_cluster.tls_ports.values())
        for node in primaries:
            pool = node.redis_connection.connection_pool
            assert issubclass(pool.connection_class, redis.SSLConnection)
            assert {k: pool.connection_kwargs[k] for k in options} == options
            assert_limiter_options(pool.connection_kwargs)

        make_policy(name="on-tls-cluster", limit=2, path="/hello/", on_error="deny")
        assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
        # read back on the plain ports: the limit's key is on the cluster
        assert sum(len(tls_cluster.client(p).keys(f"{PREFIX}*"))
                   for p in tls_cluster.ports) >= 1
    finally:
        tls_cluster.stop()


# -- a Redis Cluster -----------------------------------------------------------------------


def test_one_seed_of_the_cluster_url_finds_every_primary_with_the_limiters_timeouts(
    cluster, settings
):
    seed = cluster.url.split(",")[0]  # any listed node is enough to discover the rest
    use_url(settings, seed, SOCKET_TIMEOUT=0.25)
    from ratelimits.conf import get_config

    config = get_config()
    client = deployments.cluster_client(config["REDIS_URL"], config["SOCKET_TIMEOUT"],
                                          config["CONNECT_TIMEOUT"])
    try:
        primaries = {n.port for n in client.get_primaries()}
        assert primaries == set(cluster.primary_ports())
        assert client.retry.get_retries() == 0
        for node in client.get_primaries():
            assert_limiter_options(node.redis_connection.connection_pool.connection_kwargs, 0.25)
        # a key on each primary, written through the client and read back on that node
        placed: dict[int, str] = {}
        for i in range(200):
            key = f"{PREFIX}seed-{i}"
            placed.setdefault(client.get_node_from_key(key).port, key)
        assert set(placed) == primaries
        for port, key in placed.items():
            client.set(key, port)
            assert cluster.client(port).get(key) == str(port).encode()
    finally:
        client.close()


def test_a_cluster_url_decides_every_policy_of_a_request_on_the_cluster(
    client, make_policy, cluster, settings, redis_client
):
    """The whole path on a real cluster: the middleware's policies (an ip, a header and a
    global key: three hash tags) decided together, all or nothing, and a policy edit seen."""
    from ratelimits.engine.cluster import ClusterEngine

    use_url(settings, cluster.url)
    assert isinstance(get_engine().store, ClusterEngine)
    make_policy(name="per-ip", limit=3, path="/hello/", on_error="deny")
    make_policy(name="per-key", limit=2, path="/hello/", key="header:X-Key", on_error="deny")
    make_policy(name="everyone", limit=10, path="/hello/", key="global", on_error="deny")
    statuses = [client.get("/hello/", HTTP_X_KEY="k").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]  # per-key refused the third: nothing charged
    # per-ip was not charged for the refused request, so another key still gets one
    assert client.get("/hello/", HTTP_X_KEY="other").status_code == 200
    assert client.get("/hello/", HTTP_X_KEY="third").status_code == 429  # per-ip: 3 used
    assert sum(cluster.client(p).dbsize() for p in cluster.primary_ports()) >= 3
    assert prefixed_keys(redis_client) == set()  # the state lives on the cluster only

    # a policy saved now is seen by the next request (the version key on the cluster)
    make_policy(name="late", limit=1, path="/late/", key="global", on_error="deny")
    assert [client.get("/late/").status_code for _ in range(2)] == [404, 429]


def test_the_cluster_client_follows_moved_although_it_never_retries(cluster, settings):
    use_url(settings, cluster.url)
    from ratelimits.conf import get_config

    client = deployments.cluster_client(get_config()["REDIS_URL"], 0.1, 0.1)
    try:
        key = f"{PREFIX}moved"
        owner = client.get_node_from_key(key).port
        target = next(p for p in cluster.primary_ports() if p != owner)
        target_id = cluster.client(target).execute_command("CLUSTER", "MYID").decode()
        cluster.client(target).execute_command("CLUSTER", "BUMPEPOCH")
        slot = client.keyslot(key)
        for port in cluster.primary_ports():  # the (empty) slot now belongs to `target`
            cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        assert client.get_node_from_key(key).port == owner  # the client's map is stale
        assert client.set(key, "here")  # MOVED from the old owner, followed
        assert cluster.client(target).get(key) == b"here"
        assert client.get_node_from_key(key).port == target
    finally:
        client.close()


@pytest.fixture
def locked_cluster():
    """A cluster whose every node wants a password (and gives it to its primary)."""
    try:
        started = RedisCluster().start()
    except RuntimeError as exc:
        pytest.fail(f"the cluster tests need a Redis Cluster: {exc}")
    primaries = set(started.primary_ports())
    for port in started.live_ports():
        node = started.client(port)
        node.config_set("masterauth", PASSWORD)
        node.config_set("requirepass", PASSWORD)
    yield started, primaries
    started.stop()


def test_the_cluster_urls_password_reaches_every_node(locked_cluster, settings):
    started, expected = locked_cluster
    ports = started.url.split("://", 1)[1]
    use_url(settings, f"redis+cluster://:{PASSWORD}@{ports}")
    from ratelimits.conf import get_config

    client = deployments.cluster_client(get_config()["REDIS_URL"], 0.1, 0.1)
    try:
        primaries = {n.port for n in client.get_primaries()}
        assert primaries == expected
        written = set()
        for i in range(200):
            key = f"{PREFIX}locked-{i}"
            client.set(key, 1)
            port = client.get_node_from_key(key).port
            assert started.client(port, password=PASSWORD).get(key) == b"1"
            written.add(port)
        assert written == primaries
    finally:
        client.close()
    wrong = get_config()["REDIS_URL"].url.replace(PASSWORD, "wrong")
    use_url(settings, wrong)
    with pytest.raises(RedisClusterException, match="invalid username-password"):
        deployments.cluster_client(get_config()["REDIS_URL"], 0.1, 0.1)


def test_a_cluster_url_without_cluster_support_says_so(settings, monkeypatch):
    use_url(settings, "redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    monkeypatch.setitem(__import__("sys").modules, "ratelimits.engine.cluster", None)
    with pytest.raises(ImproperlyConfigured, match="cluster support is not installed"):
        get_engine()


def test_the_settings_page_documents_every_scheme():
    page = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    section = page.split("\n### `REDIS_URL`\n", 1)[1].split("\n### ", 1)[0]
    schemes = [s for mode in deployments.DEPLOYMENTS.values() for s in mode.schemes]
    assert schemes == ["redis", "rediss", "valkey", "valkeys", "unix", "redis+cluster",
                       "rediss+cluster", "valkey+cluster", "valkeys+cluster"]
    for scheme in schemes:
        assert f"{scheme}://" in section


@pytest.fixture
def refusing_node():
    """A real TCP port that accepts each connection and closes it at once (a node that is
    down in the worst way: it answers the connect, never a command); counts connections."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(64)
    accepted = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()


class NeverBuilt:
    """Stands in for ratelimits.engine.cluster (not on every branch): without a reachable
    node, no cluster engine may be built."""

    def __init__(self, *args, **kwargs) -> None:
        raise AssertionError("a cluster engine was built without a reachable node")


@pytest.mark.parametrize(("on_error", "status"), [("deny", 503), ("allow", 200)])
def test_a_cluster_down_at_first_use_leaves_each_request_to_on_error(
    client, make_policy, settings, monkeypatch, refusing_node, on_error, status
):
    port, accepted = refusing_node
    use_url(settings, f"redis+cluster://127.0.0.1:{port}", BREAKER_COOLDOWN=60)
    module = types.ModuleType("ratelimits.engine.cluster")
    module.ClusterEngine = NeverBuilt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ratelimits.engine.cluster", module)
    make_policy(name="on-cluster", limit=100, path="/hello/", on_error=on_error)
    accepted.clear()  # the save's own attempt to publish the version

    assert [client.get("/hello/").status_code for _ in range(6)] == [status] * 6
    # three failed builds open the circuit: the other requests touch no socket
    assert 1 <= len(accepted) <= settings.RATELIMITS.get("BREAKER_FAILURES", 3)
