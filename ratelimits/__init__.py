"""ratelimits: admin-managed request rate limiting for Django, decided atomically in Redis."""

__version__ = "0.1.0"
