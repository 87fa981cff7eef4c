"""Promises docs/reliability.md makes about the store, held by tests on a real
redis-server of their own.

- A shadow policy never refuses during a store outage, whatever its `on_error`.
- The limiter's own pool keeps the cache's database, credentials and TLS settings: its
  decisions land in the cache's database, on a server that wants a password or a client
  certificate.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from ratelimits.conf import SETTINGS
from ratelimits.pipeline.engines import get_engine
from tests.redis_server import RedisProcess, free_port

PREFIX = "tests-rl:"  # RATELIMITS["KEY_PREFIX"] in tests/settings.py
DJANGO_REDIS = "django_redis.cache.RedisCache"
DJANGOS_REDIS = "django.core.cache.backends.redis.RedisCache"


def point_cache_at(settings, location: str, backend: str = DJANGO_REDIS, **options) -> None:
    """Make the limiter's cache alias a Redis cache at `location` (a URL)."""
    entry = {"BACKEND": backend, "LOCATION": location, "KEY_PREFIX": "tests-cache"}
    if options:
        if backend == DJANGO_REDIS:  # django-redis hands pool kwargs over in their own key
            options = {"CONNECTION_POOL_KWARGS": options}
        entry["OPTIONS"] = options
    settings.CACHES = {**settings.CACHES, "default": entry}


# -- a shadow policy never refuses during an outage ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["allow", "deny", "local"])
def test_a_shadow_policy_never_refuses_while_the_store_is_down(
    client, make_policy, private_redis, settings, on_error, caplog
):
    point_cache_at(settings, private_redis.url)
    # Limits of one: every request after the first would be refused if they were enforced.
    make_policy(name="watch", mode="shadow", limit=1, on_error=on_error)
    make_policy(name="watch-api", mode="shadow", limit=1, scope="items", on_error=on_error)
    paths = ["/hello/", "/async/", "/api/items/"]
    assert [client.get(p).status_code for p in paths] == [200, 200, 200]

    private_redis.proc.send_signal(signal.SIGKILL)
    private_redis.proc.wait(5)
    with caplog.at_level(logging.WARNING, "ratelimits"):
        # enough requests to open the circuit breaker: refused connections, then no socket
        statuses = [client.get(p).status_code for _ in range(4) for p in paths]
    assert statuses == [200] * 12
    assert "store is unavailable" in caplog.text  # the outage was real
    if on_error == "local":
        # decided in process: the shadow policies still report what they would refuse
        assert "shadow policy watch would reject GET /hello/" in caplog.text
        assert "shadow policy watch-api would reject GET /api/items/" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["allow", "local"])
def test_a_shadow_deny_policy_leaves_the_outage_to_the_enforced_ones(
    client, make_policy, private_redis, settings, on_error
):
    point_cache_at(settings, private_redis.url)
    make_policy(name="strict-shadow", mode="shadow", limit=1, on_error="deny")
    make_policy(name="enforced", limit=3, on_error=on_error)
    assert client.get("/hello/").status_code == 200
    private_redis.proc.send_signal(signal.SIGKILL)
    private_redis.proc.wait(5)
    statuses = [client.get("/hello/").status_code for _ in range(5)]
    # never the shadow policy's 503: `allow` admits, `local` counts 3 in process
    assert statuses == ([200] * 5 if on_error == "allow" else [200, 200, 200, 429, 429])


# -- the limiter's own pool keeps the cache's database, credentials and TLS ----------------

PASSWORD = "s3cret-pw"
ACL_USER, ACL_PASSWORD = "limiter", "l1miter-pw"


@pytest.fixture
def locked_redis(private_redis):
    """A redis-server that wants a password, with one named ACL user besides."""
    admin = redis.Redis(port=private_redis.port)
    admin.acl_setuser(
        ACL_USER,
        enabled=True,
        passwords=[f"+{ACL_PASSWORD}"],
        keys="*",
        channels="*",
        commands=["+@all"],
    )
    admin.config_set("requirepass", PASSWORD)  # from now on, every client must log in
    admin.close()
    return private_redis


@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGOS_REDIS])
@pytest.mark.parametrize(
    ("credentials", "login"),
    [(f":{PASSWORD}", (None, PASSWORD)), (f"{ACL_USER}:{ACL_PASSWORD}", (ACL_USER, ACL_PASSWORD))],
    ids=["password", "acl-user"],
)
def test_the_limiter_decides_in_the_caches_database_with_its_credentials(
    client, make_policy, locked_redis, settings, backend, credentials, login
):
    db = 5
    point_cache_at(settings, f"redis://{credentials}@127.0.0.1:{locked_redis.port}/{db}", backend)
    kwargs = get_engine().client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs.get("username"), kwargs["password"]) == (db, *login)

    # `deny`: a limiter that could not log in, or not find its script, would answer 503
    make_policy(name="in-db-5", limit=2, path="/hello/", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]

    username, password = login
    direct = redis.Redis(port=locked_redis.port, username=username, password=password, db=db)
    keys = {k.decode() for k in direct.keys(f"{PREFIX}*")}
    assert f"{PREFIX}version" in keys  # the save published its version here
    assert len(keys) >= 2  # and the counter of policy "in-db-5"
    assert redis.Redis(port=locked_redis.port, password=PASSWORD, db=0).dbsize() == 0


def test_the_limiter_is_refused_without_the_caches_password(
    client, make_policy, locked_redis, settings
):
    """The other side of the test above: this server does refuse a client without it."""
    point_cache_at(settings, f"redis://:wrong@127.0.0.1:{locked_redis.port}/5")
    make_policy(name="locked-out", limit=2, path="/hello/", on_error="deny")
    assert client.get("/hello/").status_code == 503


def _openssl(command: str, *args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("the TLS tests make their certificates with openssl: install it")
    run = [binary, *command.split(), *args]
    subprocess.run(run, cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    """A throw-away CA, and a server and a client certificate it signed, for 127.0.0.1."""
    d = tmp_path_factory.mktemp("tls")
    new_key = "-newkey rsa:2048 -nodes -days 2"
    # The extensions Python 3.13's strict verification (VERIFY_X509_STRICT) asks for.
    _openssl(f"req -x509 {new_key} -keyout ca.key -out ca.crt", "-subj", "/CN=test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    (d / "san.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    for name in ("server", "client"):
        request = f"req {new_key} -keyout {name}.key -out {name}.csr"
        _openssl(request, "-subj", "/CN=127.0.0.1", cwd=d)
        sign = "-CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.cnf"
        _openssl(f"x509 -req -in {name}.csr -out {name}.crt {sign}", cwd=d)
    return d


@pytest.fixture
def tls_redis(certificates):
    """A redis-server that speaks TLS on a port of its own and wants a client certificate;
    yields the server and that port.

    Its plain port stays open for the start-up check and for reading keys back.
    """
    tls_port = free_port()
    server = RedisProcess(
        extra_args=(
            *("--tls-port", str(tls_port), "--tls-auth-clients", "yes"),
            *("--tls-cert-file", str(certificates / "server.crt")),
            *("--tls-key-file", str(certificates / "server.key")),
            *("--tls-ca-cert-file", str(certificates / "ca.crt")),
        )
    )
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(
            f"redis-server did not start with TLS ({exc}); this test needs a "
            "redis-server built with TLS support (BUILD_TLS=yes)"
        )
    yield server, tls_port
    server.stop()


def tls_options(certificates: Path) -> dict[str, str]:
    return {
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": str(certificates / "ca.crt"),
        "ssl_certfile": str(certificates / "client.crt"),
        "ssl_keyfile": str(certificates / "client.key"),
    }


@pytest.mark.parametrize("backend", [DJANGO_REDIS, DJANGOS_REDIS])
def test_the_limiter_speaks_tls_with_the_caches_certificates(
    client, make_policy, tls_redis, certificates, settings, backend
):
    server, tls_port = tls_redis
    options = tls_options(certificates)
    point_cache_at(settings, f"rediss://127.0.0.1:{tls_port}/2", backend, **options)
    pool = get_engine().client.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)
    kwargs = pool.connection_kwargs
    assert {k: kwargs[k] for k in options} == options
    # the limiter's own timeouts, TLS or not
    assert kwargs["socket_timeout"] == SETTINGS["SOCKET_TIMEOUT"].default

    make_policy(name="over-tls", limit=2, path="/hello/", on_error="deny")
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    direct = redis.Redis(port=server.port, db=2)
    assert direct.exists(f"{PREFIX}version") and len(direct.keys(f"{PREFIX}*")) >= 2


def test_the_tls_server_refuses_a_client_without_the_certificate(
    client, make_policy, tls_redis, certificates, settings
):
    """The other side of the test above: without its client certificate, no decision."""
    options = tls_options(certificates)
    del options["ssl_certfile"], options["ssl_keyfile"]
    _server, tls_port = tls_redis
    point_cache_at(settings, f"rediss://127.0.0.1:{tls_port}/2", **options)
    make_policy(name="no-cert", limit=2, path="/hello/", on_error="deny")
    assert client.get("/hello/").status_code == 503
