"""Compatibility layers: other rate-limiting libraries' public APIs (django-ratelimit's
decorator and functions, DRF's throttle classes), each limit decided by the ratelimits
engine as a policy declared in code, so it shows in the admin and the operator owns its
mode, rollout and overrides."""
