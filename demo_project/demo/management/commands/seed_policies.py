"""Create or update the demo's example policies and overrides (safe to run again)."""

from django.core.management.base import BaseCommand
from django.db import transaction

from demo_project.demo.seed import EXAMPLE_OVERRIDES, EXAMPLE_POLICIES
from ratelimits.models import Override, Policy


class Command(BaseCommand):
    help = "Create or update the example rate-limit policies of the demo site."

    @transaction.atomic
    def handle(self, *args, **options):
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
