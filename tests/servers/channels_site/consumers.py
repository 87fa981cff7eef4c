"""Echo consumers: every message handled is sent back as it came, so a client can tell
the messages handled from the ones refused (a `rate_limited` frame)."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer, WebsocketConsumer

from ratelimits.channels import MessageRateLimitMixin


class Echo(MessageRateLimitMixin, WebsocketConsumer):
    def connect(self):
        self.accept()

    def receive(self, text_data=None, bytes_data=None):
        self.send(text_data=text_data)


class JsonEcho(MessageRateLimitMixin, AsyncJsonWebsocketConsumer):
    async def connect(self):
        await self.accept()

    async def receive_json(self, content, **kwargs):
        await self.send_json({"echo": content})
