"""The admin while the store does not answer: every rate-limit page says so and what each
policy does meanwhile, no figure is made up, and a change that could not be published
says so instead of claiming it took effect.

Against a real redis-server of the test's own, killed or paused (SIGSTOP: it still
accepts connections, so the reads meet their socket timeout). The saves commit
(`transactional_db`), so the publications run at their commit, as in a project.
"""

from __future__ import annotations

import signal

import pytest

from ratelimits.models import Override, Policy
from ratelimits.pipeline.engines import get_engine

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/admin/ratelimits/policy/"
BANNER = "The rate-limit store is unreachable"


@pytest.fixture
def store(private_redis, settings):
    """The engine on a redis-server of this test's own."""
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": private_redis.url},
    }
    return private_redis


@pytest.fixture
def policies(db):
    """One enforced policy per on_error, a shadow one, one off, one counted per process."""
    rows = {}
    for name, fields in {
        "deny-login": {"on_error": "deny"},
        "deny-signup": {"on_error": "deny"},
        "local-api": {"on_error": "local"},
        "allow-search": {"on_error": "allow"},
        "shadow-export": {"mode": "shadow", "on_error": "deny"},
        "off-old": {"mode": "off", "on_error": "deny"},
        "node-guard": {"counting": "per_process"},
    }.items():
        policy = Policy(name=name, mode=fields.pop("mode", "enforce"), algorithm="fixed_window",
                        limit=5, period=60, key="ip", path="/api/*", **fields)
        policy.full_clean()
        policy.save()
        rows[name] = policy
    return rows


def pages(policies) -> dict[str, str]:
    login = policies["deny-login"]
    override = Override.objects.create(policy=login, match="ip:192.0.2.1", exempt=True)
    return {
        "list": URL,
        "change": f"{URL}{login.pk}/change/",
        "add": f"{URL}add/",
        "dashboard": f"{URL}dashboard/",
        "overrides": "/admin/ratelimits/override/",
        "override": f"/admin/ratelimits/override/{override.pk}/change/",
    }


def assert_banner(page: str) -> None:
    """The banner, with each policy that is not off in the group of what it does now."""
    assert BANNER in page
    text = " ".join(page.split())
    assert ("<strong>2 policies</strong> (deny-login, deny-signup): refusing every request "
            "they match, with a 503 (on_error: deny)") in text
    assert "<strong>1 policy</strong> (local-api): decided by each process alone" in text
    assert ("<strong>1 policy</strong> (allow-search): admitting every request they match, "
            "uncounted (on_error: allow)") in text
    assert "<strong>1 policy</strong> (shadow-export): in shadow: refusing nothing" in text
    assert "<strong>1 policy</strong> (node-guard): deciding as usual" in text
    assert "off-old)" not in text and "off-old," not in text  # off: does nothing
    assert "within 2 seconds of its next request" in text


def test_every_page_says_the_store_is_down_and_what_each_policy_does(
    admin_client, store, policies
):
    urls = pages(policies)
    for name, url in urls.items():  # the store answers: no banner
        response = admin_client.get(url)
        assert response.status_code == 200, name
        assert BANNER not in response.content.decode(), name
    store.stop()
    for name, url in urls.items():
        response = admin_client.get(url)
        assert response.status_code == 200, name
        assert_banner(response.content.decode())


def test_a_paused_store_gets_the_banner_too(admin_client, store, policies):
    store.proc.send_signal(signal.SIGSTOP)
    try:
        for url in (URL, f"{URL}{policies['deny-login'].pk}/change/", f"{URL}dashboard/"):
            response = admin_client.get(url)
            assert response.status_code == 200
            assert_banner(response.content.decode())
    finally:
        store.proc.send_signal(signal.SIGCONT)


def test_the_offenders_are_unknown_not_none_when_the_store_is_down(
    admin_client, store, policies
):
    page = f"{URL}{policies['deny-login'].pk}/change/"
    assert "No client was refused in the last two hours" in admin_client.get(page).content.decode()
    store.stop()
    text = admin_client.get(page).content.decode()
    assert "No client was refused" not in text
    assert 'id="rl-offenders-unknown"' in text


@pytest.mark.parametrize(("action", "mode"), [("switch_to_shadow", "shadow"),
                                               ("switch_to_enforce", "enforce"),
                                               ("turn_off", "off")])
def test_a_switch_that_could_not_be_published_says_so(admin_client, store, policies,
                                                      action, mode):
    target = policies["shadow-export" if mode == "enforce" else "deny-login"]
    store.stop()
    response = admin_client.post(URL, {"action": action, "_selected_action": [target.pk]},
                                 follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert not any(m.startswith("Switched to") for m in shown), shown
    assert any(m.startswith(f"Mode {mode} saved for {target.name}, but could not be "
                            "published: the store did not answer") and
               "within 2 seconds" in m for m in shown), shown
    assert Policy.objects.get(pk=target.pk).mode == mode  # saved all the same


def test_a_switch_that_was_published_says_it_switched(admin_client, store, policies):
    target = policies["deny-login"]
    before = get_engine().read_version()
    response = admin_client.post(URL, {"action": "switch_to_shadow",
                                       "_selected_action": [target.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert "Switched to shadow: deny-login." in shown
    assert not any("could not be published" in m for m in shown)
    assert get_engine().read_version() > before


def test_a_rollout_raised_without_the_store_says_so(admin_client, store, policies):
    target = policies["deny-login"]
    Policy.objects.filter(pk=target.pk).update(rollout=5)
    store.stop()
    response = admin_client.post(URL, {"action": "raise_rollout",
                                       "_selected_action": [target.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert not any(m.startswith("Rollout raised") for m in shown), shown
    assert any(m.startswith("Rollout saved: deny-login (25%), but could not be published")
               for m in shown), shown


def test_a_form_save_or_delete_without_the_store_says_it_was_not_published(
    admin_client, store, policies
):
    target = policies["allow-search"]
    store.stop()
    form = admin_client.get(f"{URL}{target.pk}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in
            ("created", "updated")}
    data.update({"limit": 7, "overrides-TOTAL_FORMS": 0, "overrides-INITIAL_FORMS": 0})
    response = admin_client.post(f"{URL}{target.pk}/change/", data, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert Policy.objects.get(pk=target.pk).limit == 7
    assert any(m.startswith("The change was saved, but could not be published")
               for m in shown), shown

    override = Override.objects.create(policy=target, match="ip:192.0.2.9", exempt=True)
    response = admin_client.post(f"/admin/ratelimits/override/{override.pk}/delete/",
                                 {"post": "yes"}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert not Override.objects.filter(pk=override.pk).exists()
    assert any("could not be published" in m for m in shown), shown


def test_requests_decided_by_on_error_are_counted_and_shown_once_the_store_answers(
    admin_client, client, store, policies
):
    import time

    from ratelimits.engine.errors import EngineError

    store.proc.send_signal(signal.SIGSTOP)
    try:
        statuses = [client.get("/api/orders/").status_code for _ in range(4)]
    finally:
        store.proc.send_signal(signal.SIGCONT)
    assert statuses == [503] * 4  # deny-login and deny-signup: on_error deny
    # each process sends what it tallied once the store answers (the breaker may hold
    # the first tries back for its cool-down)
    deadline = time.monotonic() + 30
    while True:
        try:
            get_engine().flush()
            break
        except EngineError:
            assert time.monotonic() < deadline, "the store never took the counts"
            time.sleep(0.1)
    listing = admin_client.get(URL)
    cells = {p.name: p._hour for p in listing.context["cl"].result_list}
    assert {name: c.fallback for name, c in cells.items()} == {
        "deny-login": 4, "deny-signup": 4, "local-api": 4, "allow-search": 4,
        "shadow-export": 4, "off-old": 0, "node-guard": 0}
    assert "4 decided by its on_error (allow): the store did not answer" in (
        listing.content.decode())
    page = admin_client.get(f"{URL}{policies['allow-search'].pk}/change/").content.decode()
    assert '<strong id="rl-fallback">4</strong> decided by its on_error (allow)' in page
    dashboard = admin_client.get(f"{URL}dashboard/").content.decode()
    assert '<td class="rl-fallback">4</td>' in dashboard


@pytest.mark.parametrize("published", [True, False])
def test_inside_a_request_wide_transaction_the_switch_says_what_happened_at_the_commit(
    admin_client, store, policies, monkeypatch, published
):
    from django.db import connection

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    target = policies["deny-login"]
    if not published:
        store.stop()
    response = admin_client.post(URL, {"action": "switch_to_shadow",
                                       "_selected_action": [target.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    if published:
        assert "Switched to shadow: deny-login." in shown
    else:
        assert not any(m.startswith("Switched to") for m in shown), shown
        assert any(m.startswith("Mode shadow saved for deny-login, but could not be "
                                "published") for m in shown), shown
