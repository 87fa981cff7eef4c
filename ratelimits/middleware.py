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
    #: Set on an async stack's instance only (see `__init__`).
    process_view: Any

    def __init__(self, get_response: Any) -> None:
        # Django builds the middleware once, when the server loads the app: a RATELIMITS
        # mistake stops the start-up here (servers never run `manage.py check`).
        ensure_valid()
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Only an async stack has a view hook (Django looks for one once, when it
            # loads the middleware): a sync stack never asks whether the view started.
            self.process_view = self._process_view

    async def _process_view(self, request: Any, view: Any, args: Any, kwargs: Any) -> None:
        """The view is called next: from here on, its request stays charged whatever the
        client does (a client that goes away cancels the request's task, but not the
        thread a sync view runs in; see `settling.abandoned`). Called as Django finds it,
        on the event loop."""
        state = getattr(request, STATE_ATTR, None)
        if state is not None:
            state.view_started = True

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
