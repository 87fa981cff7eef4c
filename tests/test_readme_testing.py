"""The test a user writes for a rate-limited login view, exactly as the README shows it
(tests/test_testing.py checks that the README still does)."""

from django.test import TestCase

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


def test_login_limit_with_the_pytest_fixture(client, ratelimits):
    ratelimits.use(LOGIN)
    for _ in range(5):
        assert client.post("/login/").status_code == 200
    assert client.post("/login/").status_code == 429
    ratelimits.clock.advance(60)
    assert client.post("/login/").status_code == 200
