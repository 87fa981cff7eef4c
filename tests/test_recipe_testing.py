"""Tests of a rate-limited login view, as a project writes them: the module that
docs/recipes/testing.md shows, run by the suite as it is shown."""

from django.test import TestCase, override_settings

from ratelimits.signals import request_limited
from ratelimits.testing import limited

LOGIN = {"name": "login", "rate": "5/m", "algorithm": "sliding_log",
         "key": "ip", "path": "/login/", "methods": "POST"}


class LoginLimitTests(TestCase):
    def test_sixth_attempt_is_refused_until_a_minute_has_passed(self):
        with limited(LOGIN) as limits:
            for _ in range(5):
                self.assertEqual(self.client.post("/login/").status_code, 200)
            refused = self.client.post("/login/")
            self.assertEqual(refused.status_code, 429)
            self.assertEqual(refused["Retry-After"], "60")

            limits.clock.advance(60)
            self.assertEqual(self.client.post("/login/").status_code, 200)

    def test_another_address_has_attempts_of_its_own(self):
        with limited(LOGIN):
            for _ in range(6):
                self.client.post("/login/")  # the test client is 127.0.0.1
            other = self.client.post("/login/", REMOTE_ADDR="203.0.113.7")
            self.assertEqual(other.status_code, 200)

    def test_a_shadow_policy_refuses_nothing_and_says_so(self):
        shadow = {**LOGIN, "mode": "shadow"}
        with limited(shadow), self.assertLogs("ratelimits", "WARNING") as logs:
            statuses = [self.client.post("/login/").status_code for _ in range(6)]
        self.assertEqual(statuses, [200] * 6)
        self.assertIn("shadow policy login would reject POST /login/", logs.output[0])


@override_settings(RATELIMITS={"TRUSTED_PROXIES": ["10.0.0.0/8"]})  # settings first
@limited(LOGIN)  # then the limits: each test starts from zero, at the same time
class BehindTheLoadBalancerTests(TestCase):
    def post_from(self, address):
        return self.client.post("/login/", REMOTE_ADDR="10.0.0.2",
                                HTTP_X_FORWARDED_FOR=address)

    def test_each_client_is_counted_on_its_own(self):
        for _ in range(5):
            self.post_from("203.0.113.7")
        self.assertEqual(self.post_from("203.0.113.7").status_code, 429)
        self.assertEqual(self.post_from("198.51.100.9").status_code, 200)

    def test_the_refusal_is_signalled(self):
        refused = []

        def receiver(sender, policy, identity, **kwargs):
            refused.append((policy, identity))

        request_limited.connect(receiver)
        self.addCleanup(request_limited.disconnect, receiver)
        for _ in range(6):
            self.post_from("203.0.113.7")
        self.assertEqual(refused, [("login", "ip:203.0.113.7")])


def test_login_limit_with_the_pytest_fixture(client, ratelimits):
    ratelimits.use(LOGIN)
    for _ in range(5):
        assert client.post("/login/").status_code == 200
    assert client.post("/login/").status_code == 429
    ratelimits.clock.advance(60)
    assert client.post("/login/").status_code == 200
