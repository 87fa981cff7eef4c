"""The admin-managed rate-limit policies: one `Policy` row is one limit, and its
`Override`s give some of its clients another limit, or none.

Django, the migrations and the project's code find every model and field here, whichever
module of the package defines it.
"""

from ratelimits.models.fields import (
    ALGORITHM_CHOICES,
    AlgorithmField,
    Counting,
    KeyField,
    Mode,
    OnError,
)
from ratelimits.models.override import Override
from ratelimits.models.policy import Policy, PolicyDashboard, human_period
from ratelimits.models.validation import (
    MAX_PERIOD,
    NAME_RULE,
    cost_function_error,
    name_error,
    request_function_error,
    reset_error,
    rollout_error,
    saved_policy_errors,
    split_methods,
)

__all__ = [
    "ALGORITHM_CHOICES",
    "MAX_PERIOD",
    "NAME_RULE",
    "AlgorithmField",
    "Counting",
    "KeyField",
    "Mode",
    "OnError",
    "Override",
    "Policy",
    "PolicyDashboard",
    "cost_function_error",
    "human_period",
    "name_error",
    "request_function_error",
    "reset_error",
    "rollout_error",
    "saved_policy_errors",
    "split_methods",
]
