"""ratelimits: admin-managed request rate limiting for Django, decided atomically in Redis."""

__version__ = "0.1.0"

__all__ = ["Limited", "limit"]


def __getattr__(name: str) -> object:
    """`limit` and `Limited` (`ratelimits.limiting`), imported when first asked for: the
    package itself imports nothing of Django's, so settings may import it."""
    if name in ("limit", "Limited"):
        from ratelimits import limiting

        return getattr(limiting, name)
    raise AttributeError(f"module 'ratelimits' has no attribute {name!r}")
