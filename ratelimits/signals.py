"""Signals sent on the request path, for metrics, alerts or audit.

Both are sent with `sender` set to the glue class that decided (`RateLimitMiddleware` or
`PolicyThrottle`) and keyword arguments `request`, `policy` (the policy's name), `key`
(the kind of key, e.g. ``"ip"``), `identity` (shortened for display), `retry_after`
(seconds) and `path`.
"""

from django.dispatch import Signal

#: An enforced policy refused a request (429).
request_limited = Signal()

#: A shadow policy would have refused a request; the request went through.
request_would_be_limited = Signal()
