"""The admin: the policies (`policies`: list, mode switches, what each policy did, the
dashboard) and their overrides (`overrides`: inline on a policy's page and in their own
list). Importing the package registers both, as Django's admin autodiscovery does."""

from ratelimits.admin.overrides import (
    INLINE_OVERRIDES,
    OverrideAdmin,
    OverrideFormSet,
    OverrideInline,
    exempts_everyone,
)
from ratelimits.admin.policies import (
    ROLLOUT_STEPS,
    PolicyAdmin,
    PolicyDashboardAdmin,
    next_rollout,
)

__all__ = [
    "INLINE_OVERRIDES",
    "ROLLOUT_STEPS",
    "OverrideAdmin",
    "OverrideFormSet",
    "OverrideInline",
    "PolicyAdmin",
    "PolicyDashboardAdmin",
    "exempts_everyone",
    "next_rollout",
]
