"""ASGI entry point of the demo site (uvicorn demo_project.asgi:application)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
application = get_asgi_application()
