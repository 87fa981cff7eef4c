"""Put the demo's example policies and overrides back as seeded (safe to run again).

Run by every `make demo`, so the tour (docs/demo.md) starts from the same place: each
example policy gets its seeded settings back (a mode switched or a rollout raised during
the tour is undone), an override the tour had you add to an example policy is removed,
and the examples of earlier demo versions are deleted. Policies of your own are left
alone.
"""

from django.core.management.base import BaseCommand
from django.db import transaction

from demo_project.demo.seed import EXAMPLE_OVERRIDES, EXAMPLE_POLICIES, RETIRED_POLICIES
from ratelimits.models import Override, Policy


class Command(BaseCommand):
    help = "Create the example rate-limit policies of the demo site, or put them back."

    @transaction.atomic
    def handle(self, *args, **options):
        for name in RETIRED_POLICIES:
            if Policy.objects.filter(name=name).delete()[0]:
                self.stdout.write(f"removed {name} (an example of an earlier demo)")
        for fields in EXAMPLE_POLICIES:
            name = fields["name"]
            policy = Policy.objects.filter(name=name).first() or Policy(name=name)
            for attr, value in fields.items():
                setattr(policy, attr, value)
            policy.full_clean()
            created = policy.pk is None
            policy.save()
            verb = "created" if created else "updated"
            self.stdout.write(f"{verb} {policy.mode:<8} {name}")
        self._overrides()

    def _overrides(self):
        seeded = {(name, fields["match"]) for name, fields in EXAMPLE_OVERRIDES}
        examples = [fields["name"] for fields in EXAMPLE_POLICIES]
        for override in Override.objects.filter(policy__name__in=examples).select_related(
            "policy"
        ):
            if (override.policy.name, override.match) not in seeded:
                override.delete()
                self.stdout.write(f"removed override {override.policy.name} {override.match} "
                                  "(not one of the examples)")
        for name, fields in EXAMPLE_OVERRIDES:
            policy = Policy.objects.get(name=name)
            override = Override.objects.filter(policy=policy, match=fields["match"]).first()
            override = override or Override(policy=policy)
            for attr, value in fields.items():
                setattr(override, attr, value)
            override.full_clean()
            created = override.pk is None
            override.save()
            verb = "created" if created else "updated"
            self.stdout.write(f"{verb} override {name} {override.match}")
