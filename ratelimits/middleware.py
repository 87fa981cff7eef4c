"""`RateLimitMiddleware`: applies the policies without a DRF scope to every request.

Works in sync and async stacks. Place it after `AuthenticationMiddleware` so `user` keys
see the user (system check ratelimits.E002).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from ratelimits.pipeline import evaluation
from ratelimits.pipeline.evaluation import UNSCOPED
from ratelimits.pipeline.responses import decorate, rejection_response


def _finish(request: Any, response: Any) -> Any:
    """Headers now; concurrency slots when the response is finished.

    A streaming response is still running when it leaves the middleware, so its slots are
    released from the response's close(), which the server calls once the body is sent
    (or the client went away).
    """
    decorate(request, response)
    state = evaluation.state_for(request)
    if state.holds:
        if getattr(response, "streaming", False):
            # Django calls every entry of _resource_closers from HttpResponseBase.close().
            response._resource_closers.append(lambda: evaluation.release(request))
        else:
            evaluation.release(request)
    return response


class RateLimitMiddleware:
    """Rate-limits requests with the admin-managed policies (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _evaluate(self, request: Any) -> Any:
        evaluation.state_for(request).middleware = True
        return evaluation.evaluate(request, scopes=UNSCOPED, sender=type(self))

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self.__acall__(request)
        verdict = self._evaluate(request)
        if verdict is not None and not verdict.allowed:
            return _finish(request, rejection_response(request, verdict))
        if verdict is not None and verdict.delay > 0:
            evaluation.sleep(verdict.delay)
        try:
            response = self.get_response(request)
        except BaseException:
            evaluation.release(request)
            raise
        return _finish(request, response)

    async def __acall__(self, request: Any) -> Any:
        verdict = await sync_to_async(self._evaluate)(request)
        if verdict is not None and not verdict.allowed:
            response = await sync_to_async(rejection_response)(request, verdict)
            return await sync_to_async(_finish)(request, response)
        if verdict is not None and verdict.delay > 0:
            await evaluation.asleep(verdict.delay)
        try:
            response = await self.get_response(request)
        except BaseException:
            await sync_to_async(evaluation.release)(request)
            raise
        return await sync_to_async(_finish)(request, response)
