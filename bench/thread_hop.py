"""The middleware as it decided under ASGI before the asyncio engine: in a worker thread
(`sync_to_async`), for the ASGI section's comparison (bench/e2e_settings.py, "thread")."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from ratelimits.middleware import RateLimitMiddleware
from ratelimits.pipeline.state import RequestState


class ThreadHopMiddleware(RateLimitMiddleware):
    async def _aevaluate(self, request: Any, state: RequestState) -> Any:
        return await sync_to_async(self._evaluate)(request, state)
