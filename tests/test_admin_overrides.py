"""A policy with many overrides in the admin: its page shows a bounded number inline and
links to all of them in the overrides' own list; it opens and saves whatever their number."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from ratelimits.admin import INLINE_OVERRIDES
from ratelimits.models import Override, Policy
from tests.test_browser import browser_page, log_in  # noqa: F401  (Chromium, and its login)

pytestmark = pytest.mark.django_db
URL = "/admin/ratelimits/policy/"
#: What a policy's page may weigh and cost, whatever its number of overrides.
MAX_BYTES = 120_000
MAX_QUERIES = 20


class _Form(HTMLParser):
    """The fields a browser posts from the page's policy form, as it shows them."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._inside = False
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._inside = a.get("id") == "policy_form"
        if not self._inside or "disabled" in a:
            return
        if tag == "input" and a.get("name") and a.get("type") not in ("submit", "button"):
            if a.get("type") != "checkbox":
                self.fields.append((a["name"], a.get("value", "")))
            elif "checked" in a:
                self.fields.append((a["name"], a.get("value", "on")))
        elif tag == "select" and a.get("name"):
            self._select = a["name"]
        elif tag == "option" and self._select and "selected" in a:
            self.fields.append((self._select, a.get("value", "")))
        elif tag == "textarea" and a.get("name"):
            self._textarea = a["name"]
            self.fields.append((self._textarea, ""))

    def handle_data(self, data: str) -> None:
        if self._textarea:
            name, text = self.fields[-1]
            self.fields[-1] = (name, text + data.removeprefix("\n"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self._inside = False


def posted(page: str, **changes: str) -> dict[str, str | list[str]]:
    """What saving `page` posts, with `changes`."""
    form = _Form()
    form.feed(page)
    data: dict[str, str | list[str]] = {}
    for name, value in form.fields:
        data.setdefault(name, []).append(value)  # type: ignore[union-attr]
    out = {k: v[0] if len(v) == 1 else v for k, v in data.items()}
    return {**out, **changes, "_save": "Save"}


def crowded(make_policy, n: int, **fields) -> Policy:
    """A policy with `n` overrides, created in bulk: ip:10.x.y.z, limit 50."""
    policy = make_policy(name="crowded", limit=100, period=60, **fields)
    Override.objects.bulk_create(
        Override(policy=policy, match=f"ip:10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                 limit=50) for i in range(n))
    return policy


@pytest.mark.parametrize("n", [150, 10_000])
def test_a_policy_with_many_overrides_opens_small_and_saves(
    admin_client, make_policy, django_assert_max_num_queries, n
):
    policy = crowded(make_policy, n)
    with django_assert_max_num_queries(MAX_QUERIES):
        response = admin_client.get(f"{URL}{policy.pk}/change/")
    page = response.content.decode()
    assert response.status_code == 200 and len(response.content) < MAX_BYTES
    assert f'name="overrides-{INLINE_OVERRIDES - 1}-match"' in page
    assert f'name="overrides-{INLINE_OVERRIDES}-match"' not in page
    assert f"Showing {INLINE_OVERRIDES} of {n} overrides, by match." in page
    assert (f'<a href="/admin/ratelimits/override/?policy__id__exact={policy.pk}">All {n} in '
            "the overrides list</a>, with search.") in page

    data = posted(page, limit="120", description="busy")
    assert len(data) < 1000  # Django refuses a post of more fields (400)
    # each row shown is validated on its own (unique match; Django 6 also checks the
    # model's constraints): bounded by the page, not by the policy's overrides
    with django_assert_max_num_queries(MAX_QUERIES + 2 * INLINE_OVERRIDES):
        response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    assert response.status_code == 302, response.context["errors"]
    policy.refresh_from_db()
    assert (policy.limit, policy.description) == (120, "busy")
    assert Override.objects.filter(policy=policy, limit=50).count() == n  # all kept as they were


def test_the_overrides_shown_are_edited_and_deleted_and_the_others_kept(
    admin_client, make_policy
):
    policy = crowded(make_policy, 150)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    first, second = Override.objects.filter(policy=policy).order_by("match")[:2]
    data = posted(page, **{"overrides-0-limit": "70", "overrides-1-DELETE": "on"})
    assert admin_client.post(f"{URL}{policy.pk}/change/", data).status_code == 302
    first.refresh_from_db()
    assert first.limit == 70
    assert not Override.objects.filter(pk=second.pk).exists()
    assert Override.objects.filter(policy=policy).count() == 149


def test_an_override_added_since_the_page_opened_is_kept(admin_client, make_policy):
    """The page posts the overrides it showed: one added meanwhile (first by match) is
    neither changed nor deleted by the save."""
    policy = crowded(make_policy, 30)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    Override.objects.create(policy=policy, match="ip:1.1.1.1", limit=9)
    data = posted(page, **{"overrides-0-DELETE": "on"})
    assert admin_client.post(f"{URL}{policy.pk}/change/", data).status_code == 302
    assert Override.objects.get(match="ip:1.1.1.1").limit == 9
    assert not Override.objects.filter(match="ip:10.0.0.0").exists()  # the one ticked


def test_a_change_the_hidden_overrides_do_not_fit_is_refused(admin_client, make_policy):
    policy = crowded(make_policy, 30)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    response = admin_client.post(f"{URL}{policy.pk}/change/", posted(page, key="user"))
    assert response.status_code == 200  # the page again, with the errors
    errors = " ".join(str(e) for f in response.context["inline_admin_formsets"]
                      for e in f.formset.non_form_errors())
    assert ("Overrides not shown here do not fit the policy as changed: 'ip:10.0.0.27': "
            "This policy counts by user") in errors
    assert "; and 7 more. Change or delete them in the overrides list" in errors
    assert Policy.objects.get(pk=policy.pk).key == "ip"

    data = posted(page, algorithm="adaptive", key="global", floor="2",
                  **{f"overrides-{i}-DELETE": "on" for i in range(INLINE_OVERRIDES)})
    response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    errors = " ".join(str(e) for f in response.context["inline_admin_formsets"]
                      for e in f.formset.non_form_errors())
    assert ("so it takes no overrides: delete them (tick Delete?) (10 not shown here: delete "
            "them in the overrides list), or choose another algorithm.") in errors
    assert Override.objects.filter(policy=policy).count() == 30


def test_a_new_override_matching_a_hidden_one_is_refused_on_its_row(admin_client, make_policy):
    policy = crowded(make_policy, 30)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    data = posted(page, **{"overrides-TOTAL_FORMS": str(INLINE_OVERRIDES + 1),
                           f"overrides-{INLINE_OVERRIDES}-match": "ip:10.0.0.29",
                           f"overrides-{INLINE_OVERRIDES}-limit": "5",
                           f"overrides-{INLINE_OVERRIDES}-policy": str(policy.pk)})
    response = admin_client.post(f"{URL}{policy.pk}/change/", data)
    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert formset.forms[INLINE_OVERRIDES].errors["match"] == [
        "This policy already has an override for 'ip:10.0.0.29', not shown here: change that "
        "one in the overrides list."]
    assert Override.objects.get(match="ip:10.0.0.29").limit == 50


def test_a_few_overrides_are_all_shown_with_a_link_to_their_list(admin_client, make_policy):
    policy = crowded(make_policy, 3)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    assert 'name="overrides-2-match"' in page and "Showing" not in page
    assert (f'<a href="/admin/ratelimits/override/?policy__id__exact={policy.pk}">This '
            "policy's overrides in the overrides list</a>") in page
    other = make_policy(name="bare")
    assert 'id="overrides-all"' not in admin_client.get(f"{URL}{other.pk}/change/").content.decode()


def test_the_overrides_list_of_one_policy_is_searched_and_paged(
    admin_client, make_policy, django_assert_max_num_queries
):
    policy = crowded(make_policy, 10_000)
    make_policy(name="other").overrides.create(match="ip:10.0.0.5", limit=1)
    url = f"/admin/ratelimits/override/?policy__id__exact={policy.pk}"
    with django_assert_max_num_queries(MAX_QUERIES):
        response = admin_client.get(url)
    assert response.status_code == 200 and len(response.content) < 2 * MAX_BYTES
    assert response.context["cl"].result_count == 10_000
    found = admin_client.get(url, {"q": "10.0.39.15"}).context["cl"].result_list
    assert [(o.policy.name, o.match) for o in found] == [("crowded", "ip:10.0.39.15")]


@pytest.mark.slow
def test_in_a_browser_the_page_links_to_all_the_overrides_and_saves(
    live_server, browser_page, django_user_model, make_policy  # noqa: F811  (the fixture)
):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    policy = crowded(make_policy, 150)
    page, base = browser_page, live_server.url
    log_in(page, base)
    page.goto(f"{base}/admin/ratelimits/policy/{policy.pk}/change/")
    assert page.locator("#overrides-group tbody tr.has_original").count() == INLINE_OVERRIDES
    note = page.locator("#overrides-all")
    assert note.is_visible() and f"Showing {INLINE_OVERRIDES} of 150 overrides" in (
        note.inner_text())

    page.fill("#id_limit", "120")  # the page as the browser posts it: under 1,000 fields
    page.click("input[name=_continue]")
    assert "was changed successfully" in page.locator(".messagelist").inner_text()
    assert Policy.objects.get(pk=policy.pk).limit == 120
    assert Override.objects.filter(policy=policy).count() == 150

    page.locator("#overrides-all a").click()
    page.wait_for_url(f"{base}/admin/ratelimits/override/?policy__id__exact={policy.pk}")
    assert page.locator("#result_list tbody tr").count() == 100  # a page of the list
    # the paginator is a <p> on Django 5.2, a <nav> on 6
    assert "150 overrides" in page.locator(".paginator").inner_text()
    page.fill("#searchbar", "10.0.0.77")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=10.0.0.77**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "ip:10.0.0.77" in rows.inner_text()
    assert f"policy__id__exact={policy.pk}" in page.url  # still this policy's only


def test_an_exempt_override_of_every_address_added_inline_is_warned_of(admin_client,
                                                                       make_policy):
    policy = make_policy(name="per-ip", limit=100, period=60)
    page = admin_client.get(f"{URL}{policy.pk}/change/").content.decode()
    data = posted(page, **{"overrides-TOTAL_FORMS": "1", "overrides-0-match": "ip:0.0.0.0/0",
                           "overrides-0-exempt": "on", "overrides-0-policy": str(policy.pk)})
    response = admin_client.post(f"{URL}{policy.pk}/change/", data, follow=True)
    assert Override.objects.filter(policy=policy, match="ip:0.0.0.0/0", exempt=True).exists()
    assert ("exempts every IPv4 client from the policy &#x27;per-ip&#x27;: it no longer "
            "limits anyone who reaches it over IPv4") in response.content.decode()
