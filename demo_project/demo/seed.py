"""The example policies the demo starts with: one enforced, one in shadow, one DRF scope,
one rolled out to a quarter of the clients, one that warms up and lets requests wait,
one that learns how many requests a slow service may take at once, one that counts only
failed logins and locks an address out. Each has a path of
its own, so each step of the tour (docs/demo.md) works alone, in any order; the admin
lists a seventh, "quote", declared in code on its view."""

EXAMPLE_POLICIES = [
    {
        "name": "hello-per-ip",
        "description": "Enforced: 5 requests a minute per client IP on /hello/.",
        "mode": "enforce",
        "algorithm": "sliding_window",
        "limit": 5,
        "period": 60,
        "key": "ip",
        "path": "/hello/",
    },
    {
        "name": "search-shadow",
        "description": "Shadow: logs what 3 searches per 10 seconds per IP would refuse.",
        "mode": "shadow",
        "algorithm": "sliding_log",
        "limit": 3,
        "period": 10,
        "key": "ip",
        "path": "/search/",
    },
    {
        "name": "items-api",
        "description": "DRF scope 'items': bursts of 5, then 10 per minute per user or IP.",
        "mode": "enforce",
        "algorithm": "token_bucket",
        "limit": 10,
        "period": 60,
        "burst": 5,
        "key": "user_or_ip",
        "path": "*",
        "scope": "items",
    },
    {
        # 127.0.0.1 is out of this policy's draw at 25% and in at 50% (the draw hashes
        # the policy's name with the client: tests/test_demo.py holds the tour to it).
        "name": "shop-rollout",
        "description": "Enforced for 25% of client IPs (the others counted as in shadow): "
        "10 requests a minute on /shop/. Raise it from the list's action.",
        "mode": "enforce",
        "rollout": 25,
        "algorithm": "fixed_window",
        "limit": 10,
        "period": 60,
        "key": "ip",
        "path": "/shop/",
    },
    {
        "name": "report-paced",
        "description": "1 report a second with a burst of 5, for a client that is warm: a "
        "cold one starts at one every 3 s and warms up over 10 s of use. A request whose "
        "turn is at most 2 s away waits for it instead of a 429.",
        "mode": "enforce",
        "algorithm": "gcra",
        "limit": 1,
        "period": 1,
        "burst": 5,
        "max_wait": 2,
        "warmup": 10,
        "key": "ip",
        "path": "/report/",
    },
    {
        "name": "busy-adaptive",
        "description": "Adaptive: learns from their latency how many requests /busy/ may "
        "run at once (1 to 16 per process); the rest get 503 at once.",
        "mode": "enforce",
        "algorithm": "adaptive",
        "limit": 16,
        "floor": 1,
        "period": 60,
        "key": "global",
        "path": "/busy/",
    },
    {
        "name": "admin-login-failures",
        "description": "Only failed logins count: 3 wrong passwords a minute per IP on the "
        "admin's login, then the address is locked out for 2 minutes. A right password "
        "before that is never refused (nor does it clear the count: anyone with an "
        "account of their own could).",
        "mode": "enforce",
        "algorithm": "sliding_log",
        "limit": 3,
        "period": 60,
        "key": "ip",
        "path": "/admin/login/",
        "methods": "POST",
        "charge_on": "login_failed",
        "reset_on": "",
        "lockout": 120,
    },
]

#: Overrides of the example policies: (policy name, fields).
EXAMPLE_OVERRIDES = [
    ("hello-per-ip", {"match": "ip:10.0.0.0/8", "exempt": True,
                      "note": "The office network is not limited."}),
    ("hello-per-ip", {"match": "ip:192.0.2.10", "limit": 50,
                      "note": "A partner's gateway: ten times the quota."}),
]

#: Example policies of earlier versions of the demo, removed by `seed_policies`:
#: "search-rollout" shared /search/ with "search-shadow", so enforcing the one changed
#: what the other's step showed.
RETIRED_POLICIES = ("search-rollout",)
