"""Django Channels: the admin's policies on WebSocket connection attempts and messages.

`WebSocketRateLimit(inner)` wraps a WebSocket router: each connection attempt is decided
against the policies of scope `websocket.connect` whose path matches the WebSocket's; a
refused one is accepted and closed at once with `LIMITED_CLOSE_CODE` (4029), so that the
client reads the code (a close before the handshake reaches it as a bare HTTP 403).
`MessageRateLimitMixin`, put before a consumer class, decides each message received
against the policies of scope `websocket.receive`; a refused message goes to the
consumer's `rate_limited()`, which by default sends the client a JSON frame saying so, and
is dropped.

Both ask the one decision path the middleware asks, with a Django request made from the
ASGI scope: the policies' keys read the client's address as for HTTP (trusted proxies
included), `scope["user"]` (from `AuthMiddlewareStack`), the handshake's headers and
query, and, for messages, the `connection` key counts each connection apart. Shadow,
overrides, rollout, the counters in the admin and `on_error` work as for a request.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from channels.consumer import SyncConsumer
from django.core.handlers.asgi import ASGIRequest

from ratelimits import runtime
from ratelimits.checks import ensure_valid
from ratelimits.matching.keykinds import (
    CONNECTION_META,
    KEY_KINDS,
    WEBSOCKET_CONNECT,
    WEBSOCKET_RECEIVE,
)
from ratelimits.pipeline import evaluation
from ratelimits.pipeline.evaluation import ADMITTED, LIMITED, Verdict
from ratelimits.pipeline.resolver import resolver
from ratelimits.pipeline.state import RequestState

__all__ = [
    "LIMITED_CLOSE_CODE",
    "UNAVAILABLE_CLOSE_CODE",
    "WEBSOCKET_CONNECT",
    "WEBSOCKET_RECEIVE",
    "MessageRateLimitMixin",
    "WebSocketRateLimit",
    "websocket_request",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The close code of a connection attempt over its limit: HTTP's 429 in the range
#: RFC 6455 leaves to applications (4000-4999), so a client can tell it from 1008
#: ("policy violation"), which servers and proxies send for many other reasons.
LIMITED_CLOSE_CODE = 4029
#: The close code of a connection attempt refused because the store was out of reach and
#: a policy's `on_error` is `deny` (HTTP's 503): RFC 6455's 1013, "try again later".
UNAVAILABLE_CLOSE_CODE = 1013

_CONNECT = frozenset({WEBSOCKET_CONNECT})
_RECEIVE = frozenset({WEBSOCKET_RECEIVE})

logger = logging.getLogger("ratelimits")


def websocket_request(scope: Scope, connection: str | None = None) -> ASGIRequest:
    """A Django request of a WebSocket's handshake (a GET), for the policies' keys: its
    address, headers and query string, `scope["user"]` as `request.user` when an
    `AuthMiddlewareStack` put one there, and `connection`, the id the `connection` key
    counts by. `request.scope` is the WebSocket's scope."""
    request = ASGIRequest({**scope, "method": "GET"}, io.BytesIO())
    if "user" in scope:
        request.user = scope["user"]
    if connection is not None:
        request.META[CONNECTION_META] = connection
    return request


#: The WebSocket scopes whose policies this process has said cannot see a user.
_told_no_user: set[str] = set()
runtime.on_reset(_told_no_user.clear)


def _warn_without_user(scope: Scope, kind: str) -> None:
    """Log once per process when a policy of scope `kind` counts by the user and a
    WebSocket's scope has none (the glue is outside `AuthMiddlewareStack`): its `user`
    key skips every client, its `user_or_ip` counts them by address."""
    if "user" in scope or kind in _told_no_user:
        return
    snap = resolver.ready()
    for policy in snap.by_scope.get(kind, ()) if snap is not None else ():
        if policy.key_spec.kind in KEY_KINDS.reads_user:
            _told_no_user.add(kind)
            logger.warning(
                "ratelimits: policy %s counts WebSocket clients by %s, but the scope has "
                "no user: put WebSocketRateLimit inside AuthMiddlewareStack "
                "(AuthMiddlewareStack(WebSocketRateLimit(URLRouter(...))))",
                policy.name, policy.key)
            return


def refusal(verdict: Verdict) -> tuple[int, str]:
    """(whole seconds to wait, the name of the policy that refused) of a refused verdict:
    the first enforced policy over its limit, else (the store out of reach) the first
    enforced one whose `on_error` is `deny`."""
    refused = verdict.rejected_by or [o for o in verdict.outcomes
                                      if o.policy.on_error == "deny" and not o.shadow]
    name = refused[0].policy.name if refused else ""
    return max(verdict.retry_after, 1), name


class WebSocketRateLimit:
    """ASGI middleware deciding WebSocket connection attempts with the policies of scope
    `websocket.connect` whose path matches; other connections (HTTP, lifespan) pass.

    Put it inside `AuthMiddlewareStack` so that `user` keys see the user::

        "websocket": AuthMiddlewareStack(WebSocketRateLimit(URLRouter(routes)))

    A refused attempt never reaches the consumer: it is accepted and closed at once with
    `limited_close_code` (or `unavailable_close_code`), the reason `retry_after=<s>`.
    """

    limited_close_code = LIMITED_CLOSE_CODE
    unavailable_close_code = UNAVAILABLE_CLOSE_CODE

    def __init__(self, inner: ASGIApp) -> None:
        # built when the server loads the application: a RATELIMITS mistake stops it here
        ensure_valid()
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.inner(scope, receive, send)
            return
        first = await receive()
        if first["type"] != "websocket.connect":  # the client left before asking
            await self.inner(scope, _replayed(first, receive), send)
            return
        request = websocket_request(scope)
        state = RequestState()
        verdict = await evaluation.aevaluate(request, scopes=_CONNECT, sender=type(self),
                                             state=state)
        _warn_without_user(scope, WEBSOCKET_CONNECT)
        if verdict is not None and verdict.status == ADMITTED and verdict.delay > 0:
            verdict = await evaluation.await_turn(verdict)
        try:
            if verdict is not None and not verdict.allowed:
                await self.refuse(send, verdict)
                return
            await self.inner(scope, _replayed(first, receive), send)
        finally:
            # a concurrency policy counts the connections open: the slot is the
            # connection's until it ends (shielded: a cancelled task still gives it back)
            if state.holds:
                await asyncio.shield(evaluation.arelease(request, state))

    async def refuse(self, send: Send, verdict: Verdict) -> None:
        """Close a refused connection attempt with the code that says why."""
        retry_after, _ = refusal(verdict)
        code = (self.limited_close_code if verdict.status == LIMITED
                else self.unavailable_close_code)
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": code,
                    "reason": f"retry_after={retry_after}"})


def _replayed(first: Message, receive: Receive) -> Receive:
    """`receive`, giving `first` (already read) once before the next messages."""
    pending = [first]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


class MessageRateLimitMixin:
    """Decides each message a WebSocket consumer receives with the policies of scope
    `websocket.receive` whose path matches the WebSocket's, before `receive()`.

    Put it first in the bases: `class Chat(MessageRateLimitMixin, WebsocketConsumer)`
    (or `AsyncWebsocketConsumer`, `JsonWebsocketConsumer`, `AsyncJsonWebsocketConsumer`).
    A refused message is dropped and `rate_limited()` called.
    """

    scope: Scope
    #: The request each message of this connection is decided with (made at the first).
    _ratelimits_request: ASGIRequest | None = None

    def rate_limited(self, retry_after: int, policy: str) -> Any:
        """A message was refused by `policy`; one could pass in `retry_after` seconds.
        By default the client is sent `{"type": "rate_limited", "policy": ...,
        "retry_after": ...}`. Override it (a coroutine function on an async consumer)
        to close the connection, count, or stay silent."""
        frame = json.dumps({"type": "rate_limited", "policy": policy,
                            "retry_after": retry_after})
        return self.send(text_data=frame)  # type: ignore[attr-defined]

    def websocket_receive(self, message: Message) -> Any:
        if not isinstance(self, SyncConsumer):  # an async consumer awaits its handlers
            return self._areceive(message)
        request, state = self._message_request()
        try:
            verdict = evaluation.evaluate(request, scopes=_RECEIVE, sender=type(self),
                                          state=state)
            if verdict is not None and verdict.status == ADMITTED and verdict.delay > 0:
                verdict = evaluation.wait_turn(verdict)
            if verdict is not None and not verdict.allowed:
                self.rate_limited(*refusal(verdict))
                return None
            return super().websocket_receive(message)  # type: ignore[misc]
        finally:
            if state.holds:
                evaluation.release(request, state)

    async def _areceive(self, message: Message) -> None:
        request, state = self._message_request()
        try:
            verdict = await evaluation.aevaluate(request, scopes=_RECEIVE, sender=type(self),
                                                 state=state)
            if verdict is not None and verdict.status == ADMITTED and verdict.delay > 0:
                verdict = await evaluation.await_turn(verdict)
            if verdict is not None and not verdict.allowed:
                told = self.rate_limited(*refusal(verdict))
                if inspect.isawaitable(told):
                    await told
                return
            await super().websocket_receive(message)  # type: ignore[misc]
        finally:
            if state.holds:
                await asyncio.shield(evaluation.arelease(request, state))

    def _message_request(self) -> tuple[ASGIRequest, RequestState]:
        """The connection's request (made at its first message) and a new state: each
        message is decided as a request of its own."""
        request = self._ratelimits_request
        if request is None:
            request = self._ratelimits_request = websocket_request(self.scope,
                                                                   uuid.uuid4().hex)
        _warn_without_user(self.scope, WEBSOCKET_RECEIVE)
        return request, RequestState()
