"""`RateLimitMiddleware`: applies the policies without a DRF scope to every request.

Works in sync and async stacks. Place it after `AuthenticationMiddleware` so `user` keys
see the user (system check ratelimits.E002).
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from ratelimits.checks import ensure_valid
from ratelimits.pipeline import evaluation, settling
from ratelimits.pipeline.evaluation import ADMITTED, UNSCOPED
from ratelimits.pipeline.responses import rejection_response
from ratelimits.pipeline.state import STATE_ATTR, RequestState, state_for


class RateLimitMiddleware:
    """Rate-limits requests with the admin-managed policies (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        # Django builds the middleware once, when the server loads the app: a RATELIMITS
        # mistake stops the start-up here (servers never run `manage.py check`).
        ensure_valid()
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Django calls an async stack's view hook as it finds it: no thread for it
            self.process_view = self._aprocess_view  # type: ignore[method-assign,assignment]

    def process_view(self, request: Any, view: Any, args: Any, kwargs: Any) -> None:
        """The view is called next: from here on, its request stays charged whatever the
        client does (under ASGI a client that goes away cancels the request's task, but
        not the thread a sync view runs in)."""
        state = getattr(request, STATE_ATTR, None)
        if state is not None:
            state.view_started = True

    async def _aprocess_view(self, request: Any, view: Any, args: Any, kwargs: Any) -> None:
        RateLimitMiddleware.process_view(self, request, view, args, kwargs)

    def _after(self, request: Any, state: RequestState, response: Any) -> Any:
        """A request left to the throttle that DRF answered before its throttles ran (a
        failed authentication, a permission denied): its unscoped policies are decided
        now, so such requests stay limited; over a limit, the answer is the 429."""
        verdict = evaluation.evaluate(request, scopes=UNSCOPED, sender=type(self), state=state)
        if verdict is not None and not verdict.allowed:
            return rejection_response(request, verdict)
        return response

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        # From the decision on the request may hold slots (and a place in the waiting
        # room): whatever fails, at any step, gives them back.
        state = state_for(request)
        try:
            verdict = evaluation.evaluate(request, scopes=UNSCOPED, sender=type(self),
                                          state=state, middleware=True)
            if verdict is not None:
                if verdict.status == ADMITTED and verdict.delay > 0:
                    verdict = evaluation.wait_turn(verdict)
                if verdict.status != ADMITTED:
                    return settling.finish(request, state, rejection_response(request, verdict))
            response = self.get_response(request)
            if state.deferred and not state.throttled:
                response = self._after(request, state, response)
            return settling.finish(request, state, response)
        except BaseException:
            evaluation.release(request, state)
            raise

    async def __acall__(self, request: Any) -> Any:
        # Decided on the event loop (the store awaited, see engine.aio); a refusal's
        # response goes to a thread, as a REJECT_VIEW of yours may query the database.
        # A task cancelled at any step (the client went away: Django cancels the
        # request's task), or one that fails, gives back what it holds.
        state = state_for(request)
        try:
            return await settling.afinish(request, state, await self._arespond(request, state))
        except BaseException:
            # shielded: a second cancellation must not stop the release half-way
            await asyncio.shield(settling.abandoned(request, state))
            raise

    async def _arespond(self, request: Any, state: RequestState) -> Any:
        verdict = await evaluation.aevaluate(request, scopes=UNSCOPED, sender=type(self),
                                             state=state, middleware=True)
        if verdict is not None:
            if verdict.status == ADMITTED and verdict.delay > 0:
                verdict = await evaluation.await_turn(verdict)
            if verdict.status != ADMITTED:
                return await sync_to_async(rejection_response)(request, verdict)
        response = await self.get_response(request)
        if state.deferred and not state.throttled:
            response = await sync_to_async(self._after)(request, state, response)
        return response
