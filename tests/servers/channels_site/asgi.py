import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.servers.channels_site.settings")
django_asgi_app = get_asgi_application()  # sets Django up before the consumers import

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from ratelimits.channels import WebSocketRateLimit  # noqa: E402
from tests.servers.channels_site import consumers  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": AuthMiddlewareStack(WebSocketRateLimit(URLRouter([
        path("ws/echo/", consumers.Echo.as_asgi()),
        path("ws/json/", consumers.JsonEcho.as_asgi()),
    ]))),
})
