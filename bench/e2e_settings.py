"""Settings of the end-to-end benchmark: the demo site, one scenario chosen by env var.

BENCH_E2E_SCENARIO:
  none     no rate limiting: RateLimitMiddleware removed, RATELIMITS["ENABLED"] False,
           no DRF throttle classes (baseline of both /hello/ and /api/items/)
  ours     the demo as it ships: RateLimitMiddleware + PolicyThrottle, with the policies
           in the bench database
  drf      DRF's AnonRateThrottle + UserRateThrottle at BENCH_DRF_RATE, ours off
  compat   ours with DRF's API: ratelimits.compat.drf's AnonRateThrottle +
           UserRateThrottle at BENCH_DRF_RATE, no RateLimitMiddleware (as drf)
  dr       django-ratelimit's own `@ratelimit` on /dr-hello/ (bench/e2e_urls.py), its
           client read from X-Forwarded-For (RATELIMIT_IP_META_KEY), ours off
  drcompat ours with django-ratelimit's API: the same decorator and arguments from
           ratelimits.compat.django_ratelimit, no RateLimitMiddleware (as dr)
  floor    the floor: bench.floor.FloorMiddleware in our middleware's place (one EVALSHA
           of `return 1` per request, nothing else), ours off, no DRF throttle classes
  thread   ours, with the async stack's decision handed to a thread by `sync_to_async`
           (as before the asyncio engine): the ASGI section's comparison
The demo's own settings (REDIS_URL, DEMO_DB) apply as usual. The URLs are the demo's and
/async-hello/, an async twin of /hello/ for the ASGI section.
"""

import os

from demo_project.settings import *  # noqa: F403
from demo_project.settings import MIDDLEWARE, RATELIMITS

SCENARIO = os.environ.get("BENCH_E2E_SCENARIO", "ours")
DEBUG = False
LOGGING = {"version": 1, "disable_existing_loggers": False}

# wrk names each request's client in X-Forwarded-For (bench/wrk_clients.lua), as a load
# balancer in front of the site would: ours reads it behind the trusted proxy, DRF's
# throttles read the header by default.
RATELIMITS = {**RATELIMITS, "TRUSTED_PROXIES": ["127.0.0.1"], "PROXY_HEADER": "x-forwarded-for"}

ROOT_URLCONF = "bench.e2e_urls"
_OURS = "ratelimits.middleware.RateLimitMiddleware"


if SCENARIO == "ours":
    pass  # the demo as it ships: middleware + PolicyThrottle
elif SCENARIO == "thread":
    MIDDLEWARE = ["bench.thread_hop.ThreadHopMiddleware" if m == _OURS else m
                  for m in MIDDLEWARE]
elif SCENARIO in ("none", "floor", "drf", "compat", "dr", "drcompat"):
    floor = ["bench.floor.FloorMiddleware"] if SCENARIO == "floor" else []
    MIDDLEWARE = [n for m in MIDDLEWARE for n in (floor if m == _OURS else [m])]
    SILENCED_SYSTEM_CHECKS = ["ratelimits.W002"]
    if SCENARIO not in ("compat", "drcompat"):  # the compat layers decide with our engine
        RATELIMITS = {**RATELIMITS, "ENABLED": False}
    # django-ratelimit's `ip` key: the client wrk names, as ours reads it behind the proxy
    RATELIMIT_IP_META_KEY = "HTTP_X_FORWARDED_FOR"
    if SCENARIO in ("none", "floor", "dr", "drcompat"):
        REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": []}
    else:
        rate = os.environ.get("BENCH_DRF_RATE", "1000000/min")
        module = "rest_framework.throttling" if SCENARIO == "drf" else "ratelimits.compat.drf"
        REST_FRAMEWORK = {
            "DEFAULT_THROTTLE_CLASSES": [f"{module}.AnonRateThrottle",
                                         f"{module}.UserRateThrottle"],
            "DEFAULT_THROTTLE_RATES": {"anon": rate, "user": rate},
        }
else:
    raise RuntimeError(f"unknown BENCH_E2E_SCENARIO {SCENARIO!r}")
