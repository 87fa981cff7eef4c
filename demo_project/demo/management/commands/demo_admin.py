"""Create (or reset) the demo's admin login and print it."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or reset the demo superuser and print its login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", help="default: a fresh random password")
        parser.add_argument(
            "--port", type=int, default=8000, help="the port the demo is served on (8000)"
        )

    def handle(self, *args, username, password, port, **options):
        password = password or secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(
            f"Admin: http://127.0.0.1:{port}/admin/  user: {username}  password: {password}"
        )
