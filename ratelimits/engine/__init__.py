"""The framework-free rate-limit engine: value types and the Redis and in-process backends."""

from ratelimits.engine.errors import EngineError, EngineUnavailable
from ratelimits.engine.memory import MemoryEngine
from ratelimits.engine.redis_backend import RedisEngine
from ratelimits.engine.registry import ALGORITHMS
from ratelimits.engine.types import Decision, Limit, Result

__all__ = [
    "ALGORITHMS",
    "Decision",
    "EngineError",
    "EngineUnavailable",
    "Limit",
    "MemoryEngine",
    "RedisEngine",
    "Result",
]
