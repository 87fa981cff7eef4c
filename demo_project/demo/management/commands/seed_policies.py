"""Create or update the demo's example policies (safe to run again)."""

from django.core.management.base import BaseCommand
from django.db import transaction

from demo_project.demo.seed import EXAMPLE_POLICIES
from ratelimits.models import Policy


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
