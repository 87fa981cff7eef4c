"""Django Channels: WebSocket connection attempts and messages under the admin's policies.

The server tests serve tests/servers/channels_site (a project with Channels' routing, as
docs/recipes/websockets.md sets one up) with uvicorn on a private redis-server, and talk
to it with a real WebSocket client (`websockets`). Every policy counts per minute or
more, so no test waits for a window to pass, and counts with `sliding_log`, exact in
every minute-long interval: a test that runs across the turn of a minute (a fixed
window's reset) counts the same.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest
from django.core.exceptions import ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from ratelimits.channels import (
    LIMITED_CLOSE_CODE,
    UNAVAILABLE_CLOSE_CODE,
    WEBSOCKET_CONNECT,
    WEBSOCKET_RECEIVE,
    websocket_request,
)
from ratelimits.matching.keykinds import parse_key
from ratelimits.models import Policy
from tests.support.workers import ROOT, Site

#: Seconds a client waits for a frame: generous, for a loaded two-core machine.
WAIT = 20


def errors(**fields):
    try:
        Policy(name="p", limit=5, **fields).full_clean()
    except ValidationError as exc:
        return exc.message_dict
    return {}


# -- what a WebSocket policy may be ------------------------------------------------------


@pytest.mark.django_db  # full_clean() asks whether the name is taken
def test_websocket_policies_are_valid_without_methods_or_responses():
    assert errors(scope=WEBSOCKET_CONNECT, path="/ws/chat/", key="ip") == {}
    assert errors(scope=WEBSOCKET_RECEIVE, path="/ws/**", key="connection") == {}
    assert errors(scope=WEBSOCKET_RECEIVE, key="user") == {}


@pytest.mark.django_db
def test_what_a_websocket_policy_cannot_have_is_refused_with_what_to_fix():
    assert errors(key="connection") == {"key": [
        "connection counts the messages of each WebSocket connection: give the policy the "
        "scope websocket.receive, or choose another key."]}
    assert errors(scope=WEBSOCKET_CONNECT, key="connection")["key"]
    assert errors(scope=WEBSOCKET_RECEIVE, methods="GET") == {"methods": [
        "A WebSocket policy is matched by its path alone: leave methods empty."]}
    assert errors(scope=WEBSOCKET_CONNECT, charge_on="4xx") == {"charge_on": [
        "A WebSocket has no responses to look at: leave charge_on empty."]}


def test_a_websocket_request_gives_the_keys_what_an_http_one_does():
    from django.contrib.auth.models import AnonymousUser

    scope = {"type": "websocket", "path": "/ws/chat/", "query_string": b"room=7",
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
             "headers": [(b"x-forwarded-for", b"203.0.113.9"), (b"x-api-key", b"k-1")],
             "user": AnonymousUser()}
    request = websocket_request(scope, "c0ffee")
    read = {key: parse_key(key).identify(request, trusted_proxies=parse_proxies("127.0.0.1"))
            for key in ("ip", "user", "user_or_ip", "header:X-Api-Key", "query:room",
                        "connection")}
    assert read == {"ip": "ip:203.0.113.9", "user": None, "user_or_ip": "ip:203.0.113.9",
                    "header:X-Api-Key": "header:k-1", "query:room": "query:7",
                    "connection": "connection:c0ffee"}
    assert request.scope["type"] == "websocket" and request.method == "GET"
    # an HTTP request has no connection: a `connection` policy never applies to one
    assert parse_key("connection").identify(websocket_request({**scope, "type": "http"})) is None


def parse_proxies(*networks):
    from ratelimits.matching.identity import parse_trusted_proxies

    return parse_trusted_proxies(networks)


# -- under uvicorn, with a real client ----------------------------------------------------


class ChannelsSite(Site):
    """tests/servers/channels_site under uvicorn, started as a user starts it."""

    def __init__(self, tmp, redis_url):
        super().__init__(tmp, redis_url, settings="tests.servers.channels_site.settings",
                         probe=None)

    def start(self):  # type: ignore[override]
        # the forwarding header is read by the site's TRUSTED_PROXIES, not by uvicorn
        self.start_asgi("tests.servers.channels_site.asgi:application", "--no-proxy-headers")

    def url(self, path):
        return f"ws://127.0.0.1:{self.port}{path}"

    def output(self, code):
        """What `code`, run in a process of the site (Django set up), prints."""
        out = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code],
                             cwd=ROOT, env=self.env, check=True, timeout=60,
                             capture_output=True, text=True)
        return out.stdout.strip()

    def counts(self, name, expected):
        """The policy's figures of the last hour, as the admin shows them, once they are
        `expected` (each server process sends its counts within a second of counting, on
        a busy machine when its thread runs), or as they stand after 30 s."""
        script = ("import json, time\nfrom ratelimits.ops import observe\n"
                  f"expected, deadline = {expected!r}, time.monotonic() + 30\n"
                  "while True:\n"
                  f"    c = observe.last_hour([{name!r}])[{name!r}]\n"
                  "    got = {'admitted': c.admitted, 'rejected': c.rejected, "
                  "'would_reject': c.would_reject}\n"
                  "    if got == expected or time.monotonic() > deadline:\n"
                  "        break\n"
                  "    time.sleep(0.1)\n"
                  "print(json.dumps(got))")
        return json.loads(self.output(script))

    def signed_in(self, username):
        """The session cookie of a new user signed in, as the login view leaves it."""
        return "sessionid=" + self.output(
            "from django.contrib import auth\n"
            "from django.contrib.sessions.backends.db import SessionStore\n"
            f"user = auth.get_user_model().objects.create_user({username!r})\n"
            "session = SessionStore()\n"
            "session[auth.SESSION_KEY] = str(user.pk)\n"
            "session[auth.BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend'\n"
            "session[auth.HASH_SESSION_KEY] = user.get_session_auth_hash()\n"
            "session.create()\nprint(session.session_key)")


@pytest.fixture
def site(tmp_path, private_redis):
    site = ChannelsSite(tmp_path, private_redis.url)
    yield site
    site.stop()


def exchange(site, path, messages, **headers):
    """Send `messages` on one connection, then read one frame per message: the echo of
    each handled one, a refusal for each refused one."""
    with connect(site.url(path), additional_headers=headers, open_timeout=WAIT) as ws:
        for message in messages:
            ws.send(message)
        return [ws.recv(timeout=WAIT) for _ in messages]


def refusal(frame):
    """The refusal frame's content, or None for any other frame."""
    try:
        content = json.loads(frame)
    except ValueError:
        return None
    return content if isinstance(content, dict) and content.get("type") == "rate_limited" \
        else None


def closed_with(site, path, **headers):
    """(close code, reason) of a connection the server closes before any message; None
    when it stays open (its echo of a message comes back)."""
    with connect(site.url(path), additional_headers=headers, open_timeout=WAIT) as ws:
        try:
            ws.send('"ping"')  # JSON, for the JSON consumer too
            assert ws.recv(timeout=WAIT) in ('"ping"', '{"echo": "ping"}')
            return None
        except ConnectionClosed as closed:
            return closed.rcvd.code, closed.rcvd.reason


@pytest.mark.parametrize("path, message, echo", [
    ("/ws/echo/", "m{}", "m{}"),  # WebsocketConsumer: sync, in a thread
    ("/ws/json/", '{{"n": {}}}', '{{"echo": {{"n": {}}}}}'),  # AsyncJsonWebsocketConsumer
])
def test_twenty_messages_against_five_a_minute(site, path, message, echo):
    site.policy(name="chat-messages", mode="enforce", algorithm="sliding_log", limit=5,
                period=60, key="connection", scope=WEBSOCKET_RECEIVE, path=path)
    site.start()
    frames = exchange(site, path, [message.format(i) for i in range(20)])
    handled = [f for f in frames if refusal(f) is None]
    refused = [refusal(f) for f in frames if refusal(f) is not None]
    assert handled == [echo.format(i) for i in range(5)]  # the first five, in order
    assert len(refused) == 15
    for frame in refused:
        assert set(frame) == {"type", "policy", "retry_after"}
        assert frame["policy"] == "chat-messages"
        assert 1 <= frame["retry_after"] <= 60
    # counted per connection: a new one has its own five
    assert exchange(site, path, [message.format(i) for i in range(5)]) == [
        echo.format(i) for i in range(5)]
    expected = {"admitted": 10, "rejected": 15, "would_reject": 0}
    assert site.counts("chat-messages", expected) == expected


def test_a_user_key_counts_the_user_that_auth_middleware_stack_found(site):
    site.policy(name="per-user", mode="enforce", algorithm="sliding_log", limit=3,
                period=60, key="user", scope=WEBSOCKET_RECEIVE, path="/ws/echo/")
    site.start()
    ann = {"Cookie": site.signed_in("ann")}
    assert exchange(site, "/ws/echo/", ["a", "b"], **ann) == ["a", "b"]
    # another connection of the same user shares the quota
    frames = exchange(site, "/ws/echo/", ["c", "d", "e"], **ann)
    assert frames[0] == "c" and [refusal(f)["policy"] for f in frames[1:]] == ["per-user"] * 2
    # another user has her own; an anonymous client has no user to count: not limited
    assert exchange(site, "/ws/echo/", ["f"] * 3, Cookie=site.signed_in("bob")) == ["f"] * 3
    assert exchange(site, "/ws/echo/", ["g"] * 5) == ["g"] * 5


def test_connection_attempts_over_their_limit_are_closed_with_4029(site):
    site.policy(name="chat-connects", mode="enforce", algorithm="sliding_log", limit=2,
                period=60, key="ip", scope=WEBSOCKET_CONNECT, path="/ws/**")
    site.start()
    client = {"X-Forwarded-For": "203.0.113.9"}  # behind the site's trusted proxy
    assert closed_with(site, "/ws/echo/", **client) is None
    assert closed_with(site, "/ws/json/", **client) is None
    code, reason = closed_with(site, "/ws/echo/", **client)
    assert code == LIMITED_CLOSE_CODE == 4029
    seconds = int(reason.removeprefix("retry_after="))
    assert reason == f"retry_after={seconds}" and 1 <= seconds <= 60
    # another client, as the proxy names it, has its own quota
    assert closed_with(site, "/ws/echo/", **{"X-Forwarded-For": "198.51.100.4"}) is None
    expected = {"admitted": 3, "rejected": 1, "would_reject": 0}
    assert site.counts("chat-connects", expected) == expected


def test_a_concurrency_policy_counts_the_connections_open(site):
    site.policy(name="one-tab", mode="enforce", algorithm="concurrency", limit=1,
                period=60, key="ip", scope=WEBSOCKET_CONNECT, path="/ws/echo/")
    site.start()
    with connect(site.url("/ws/echo/"), open_timeout=WAIT) as first:
        first.send("hi")
        assert first.recv(timeout=WAIT) == "hi"
        assert closed_with(site, "/ws/echo/")[0] == LIMITED_CLOSE_CODE  # one is open
    # the slot comes back when the connection ends (the server hears of it a moment later)
    deadline = time.monotonic() + WAIT
    while (answer := closed_with(site, "/ws/echo/")) is not None:
        assert time.monotonic() < deadline, f"still refused after the close: {answer}"
        time.sleep(0.1)


def test_shadow_lets_every_message_through_and_counts_the_would_be_refusals(site):
    site.policy(name="chat-watch", mode="shadow", algorithm="sliding_log", limit=5,
                period=60, key="connection", scope=WEBSOCKET_RECEIVE, path="/ws/echo/")
    site.policy(name="connect-watch", mode="shadow", algorithm="sliding_log", limit=1,
                period=60, key="ip", scope=WEBSOCKET_CONNECT, path="/ws/echo/")
    site.start()
    assert exchange(site, "/ws/echo/", [f"m{i}" for i in range(20)]) == [
        f"m{i}" for i in range(20)]
    assert closed_with(site, "/ws/echo/") is None  # a second connection, one message
    expected = {"admitted": 6, "rejected": 0, "would_reject": 15}
    assert site.counts("chat-watch", expected) == expected
    expected = {"admitted": 1, "rejected": 0, "would_reject": 1}
    assert site.counts("connect-watch", expected) == expected


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_a_store_outage_follows_on_error_without_a_traceback(site, private_redis,
                                                             on_error):
    site.policy(name="connects", mode="enforce", limit=100, period=60, key="ip",
                scope=WEBSOCKET_CONNECT, path="/ws/json/", on_error=on_error)
    site.policy(name="messages", mode="enforce", limit=100, period=60, key="connection",
                scope=WEBSOCKET_RECEIVE, path="/ws/echo/", on_error=on_error)
    # a policy that lets messages through in an outage is not the one a refusal names
    site.policy(name="lenient", mode="enforce", limit=100, period=60, key="connection",
                scope=WEBSOCKET_RECEIVE, path="/ws/echo/", on_error="allow", priority=1)
    site.start()
    assert closed_with(site, "/ws/json/") is None  # the store answers: admitted
    private_redis.proc.send_signal(signal.SIGKILL)
    private_redis.proc.wait()
    frames = exchange(site, "/ws/echo/", ["a", "b"])
    if on_error == "allow":
        assert frames == ["a", "b"]
        assert closed_with(site, "/ws/json/") is None
    else:
        assert [refusal(f) for f in frames] == [
            {"type": "rate_limited", "policy": "messages", "retry_after": 1}] * 2
        assert closed_with(site, "/ws/json/") == (UNAVAILABLE_CLOSE_CODE, "retry_after=1")
    site.stop()
    assert "Traceback" not in site.server.stderr.read().decode()  # nothing escaped the app


# -- the hook, overridden (in process, the consumer driven as a server drives it) ----------


@pytest.mark.django_db  # a consumer closes stale database connections before each message
def test_an_async_consumer_may_override_the_hook_to_close_the_connection():
    from asgiref.sync import async_to_sync
    from channels.generic.websocket import AsyncWebsocketConsumer

    from ratelimits.channels import MessageRateLimitMixin
    from ratelimits.testing import limited

    told = []

    class StrictChat(MessageRateLimitMixin, AsyncWebsocketConsumer):
        async def connect(self):
            await self.accept()

        async def receive(self, text_data=None, bytes_data=None):
            await self.send(text_data=text_data)

        async def rate_limited(self, retry_after, policy):
            told.append((policy, retry_after))
            await self.close(code=LIMITED_CLOSE_CODE)

    async def talk():
        incoming, sent = asyncio.Queue(), []
        for message in ({"type": "websocket.connect"},
                        {"type": "websocket.receive", "text": "a"},
                        {"type": "websocket.receive", "text": "b"}):
            incoming.put_nowait(message)

        async def send(message):
            sent.append(message)
            if message["type"] == "websocket.close":  # the client hears it and leaves
                incoming.put_nowait({"type": "websocket.disconnect", "code": message["code"]})

        scope = {"type": "websocket", "path": "/ws/strict/", "query_string": b"",
                 "headers": [], "client": ("127.0.0.1", 50000), "subprotocols": []}
        await asyncio.wait_for(StrictChat.as_asgi()(scope, incoming.get, send), WAIT)
        return sent

    with limited({"name": "strict", "rate": "1/m", "algorithm": "fixed_window",
                  "key": "connection", "scope": WEBSOCKET_RECEIVE, "path": "/ws/strict/"}):
        sent = async_to_sync(talk)()
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send",
                                         "websocket.close"]
    assert sent[1]["text"] == "a"  # the first message handled, the second refused
    assert sent[2]["code"] == LIMITED_CLOSE_CODE
    assert told == [("strict", 60)]  # the clock stands at the window's start: all of it


def test_a_user_policy_without_a_user_in_the_scope_says_where_the_glue_goes(caplog):
    """WebSocketRateLimit outside AuthMiddlewareStack sees no user: said once, with the
    order to write."""
    from asgiref.sync import async_to_sync

    from ratelimits.channels import WebSocketRateLimit
    from ratelimits.testing import limited

    async def consumer(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    async def attempt(scope):
        incoming, sent = asyncio.Queue(), []
        incoming.put_nowait({"type": "websocket.connect"})

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(WebSocketRateLimit(consumer)(scope, incoming.get, send), WAIT)
        return sent

    scope = {"type": "websocket", "path": "/ws/", "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 50000)}
    with limited({"name": "per-user-connects", "rate": "5/m", "key": "user",
                  "scope": WEBSOCKET_CONNECT, "path": "/ws/"}):
        for _ in range(3):
            assert async_to_sync(attempt)(scope)[0] == {"type": "websocket.accept"}
        told = [r.getMessage() for r in caplog.records if "no user" in r.getMessage()]
        assert told == [
            "ratelimits: policy per-user-connects counts WebSocket clients by user, but the "
            "scope has no user: put WebSocketRateLimit inside AuthMiddlewareStack "
            "(AuthMiddlewareStack(WebSocketRateLimit(URLRouter(...))))"]
        caplog.clear()
        async_to_sync(attempt)({**scope, "user": None})  # a stack that put one there
        assert not [r for r in caplog.records if "no user" in r.getMessage()]
