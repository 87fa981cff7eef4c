"""A `post:` key counts the account a login is for as Django's own login views find it:
the username NFKC-normalized as `AuthenticationForm` does, read from a form body or a JSON
one (DRF's `obtain_auth_token`). Django's `LoginView` and DRF's token view are the views
(tests/urls.py), through the middleware, on Redis and in process."""

from __future__ import annotations

import json
import unicodedata

import pytest
from django.contrib.auth.forms import AuthenticationForm
from django.test import Client, RequestFactory

from ratelimits.matching.identity import IdentityError
from ratelimits.matching.keykinds import identity_from_text, parse_key

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
TOKEN = "/api/token/"
RIGHT = "right-horse"

# Spellings of "alice" that NFKC folds to it: mathematical monospace, bold, sans-serif,
# fullwidth and circled letters
SPELLINGS = [
    "".join(chr(base + ord(c) - ord("a")) for c in "alice")
    for base in (0x1D68A, 0x1D41A, 0x1D5BA, 0xFF41, 0x24D0)
]


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password=RIGHT)


def test_the_spellings_are_alice_to_django():
    assert {unicodedata.normalize("NFKC", s) for s in SPELLINGS} == {"alice"}
    assert "alice" not in SPELLINGS


def test_django_logs_a_unicode_spelling_in_as_alice(alice):
    """What makes the spellings one account: Django's own form normalizes the username."""
    request = RequestFactory().post(LOGIN)
    form = AuthenticationForm(request, data={"username": SPELLINGS[0], "password": RIGHT})
    assert form.is_valid() and form.get_user() == alice
    assert Client().post(LOGIN, {"username": SPELLINGS[0], "password": RIGHT}).status_code == 302


def test_unicode_spellings_share_the_username_count_at_django_login_view(
    make_policy, any_store, alice
):
    make_policy(name="login-user", key="post:username", path=LOGIN, methods="POST",
                limit=5, period=900)
    client = Client()
    guesses = [name for name in [*SPELLINGS, "alice"] for _ in range(5)]
    statuses = [client.post(LOGIN, {"username": name, "password": "guess"}).status_code
                for name in guesses]
    # LoginView answers a wrong password with the form again (200); 30 guesses, 5 reach it
    assert (statuses.count(200), statuses.count(429)) == (5, 25)
    assert client.post(LOGIN, {"username": "alice", "password": RIGHT}).status_code == 429
    assert [client.post(LOGIN, {"username": s, "password": RIGHT}).status_code
            for s in SPELLINGS] == [429] * len(SPELLINGS)
    # another account keeps its own count
    assert client.post(LOGIN, {"username": "bob", "password": "guess"}).status_code == 200


@pytest.mark.parametrize("kind", ["post:username", "query:username", "header:X-Username"])
def test_client_sent_values_are_nfkc_normalized(kind):
    spec = parse_key(kind)
    factory = RequestFactory()

    def request(name):
        if spec.kind == "post":
            return factory.post("/", {"username": name})
        if spec.kind == "query":
            return factory.get("/", {"username": name})
        # a header arrives as its bytes read as latin-1 (PEP 3333), as Django keeps it
        return factory.get("/", HTTP_X_USERNAME=name.encode().decode("latin-1"))

    identities = {spec.identify(request(name)) for name in [*SPELLINGS, " alice "]}
    assert identities == {f"{spec.kind}:alice"}
    # case is kept: Django's default user model looks the username up as given
    assert spec.identify(request("Alice")) == f"{spec.kind}:Alice"
    # an operator's typed client (an override, a reset) is normalized as a request is
    assert identity_from_text(spec.kind, f"{spec.kind}:{SPELLINGS[0]}") == f"{spec.kind}:alice"
    assert identity_from_text(spec.kind, SPELLINGS[1]) == f"{spec.kind}:alice"


def test_ascii_values_keep_their_identities():
    """Normalizing changes no ASCII value: the counts stored under them stay theirs."""
    spec = parse_key("post:username")
    factory = RequestFactory()
    for name in ["alice", "Alice", "alice@example.com", "x" * 300, "h:abc"]:
        unnormalized = spec.identify(factory.post("/", {"username": name}))
        assert unnormalized == identity_from_text("post", name)
    assert spec.identify(factory.post("/", {"username": "alice"})) == "post:alice"


def test_a_value_that_normalizes_to_nothing_is_no_client():
    # U+00A0 is a space to NFKC and to str.strip(): Django finds no username either
    request = RequestFactory().post("/", {"username": "\u00a0"})
    assert parse_key("post:username").identify(request) is None


# -- JSON bodies ---------------------------------------------------------------------------


def post_json(client, username, password="guess", path=TOKEN):
    return client.post(path, json.dumps({"username": username, "password": password}),
                       content_type="application/json").status_code


def test_json_guesses_reach_429_at_drf_obtain_auth_token(make_policy, any_store, alice):
    make_policy(name="token-user", key="post:username", path=TOKEN, methods="POST",
                limit=5, period=900)
    client = Client()
    statuses = [post_json(client, "alice") for _ in range(30)]
    # DRF answers a wrong password with 400; from the sixth guess the policy refuses
    assert statuses == [400] * 5 + [429] * 25
    assert post_json(client, "alice", RIGHT) == 429
    # a form body and a JSON one name the same client
    assert client.post(TOKEN, {"username": "alice", "password": RIGHT}).status_code == 429
    assert post_json(client, "bob") == 400


def test_the_token_view_still_reads_the_json_body_it_was_sent(make_policy, any_store, alice):
    make_policy(name="token-user", key="post:username", path=TOKEN, methods="POST",
                limit=5, period=900)
    response = Client().post(TOKEN, {"username": "alice", "password": RIGHT},
                             content_type="application/json")
    assert response.status_code == 200 and "token" in response.json()
    spelled = Client().post(TOKEN, json.dumps({"username": SPELLINGS[0], "password": "x"}),
                            content_type="application/json; charset=utf-8")
    assert spelled.status_code == 400


@pytest.mark.parametrize(("body", "content_type", "identity"), [
    ('{"username": "alice"}', "application/json", "post:alice"),
    ('{"username": "alice"}', "Application/JSON; charset=utf-8", "post:alice"),
    ('{"username": "alice"}', "application/vnd.api+json", "post:alice"),
    ('{"username": "\\ud835\\ude8alice"}', "application/json", "post:alice"),
    ('{"username": 42}', "application/json", "post:42"),  # DRF's CharField takes numbers
    ('{"username": "a", "username": "alice"}', "application/json", "post:alice"),  # the last
    ('{"username": true}', "application/json", None),
    ('{"username": null}', "application/json", None),
    ('{"username": ["alice"]}', "application/json", None),
    ('{"username": {"a": 1}}', "application/json", None),
    ('{"user": "alice"}', "application/json", None),
    ('["alice"]', "application/json", None),
    ('"alice"', "application/json", None),
    ("{not json", "application/json", None),
    ("[" * 100_000 + "]" * 100_000, "application/json", None),
    ("\xff\xfe{", "application/json", None),
    ("", "application/json", None),
    ('{"username": "alice"}', "text/plain", None),  # not JSON to a parser either
])
def test_a_json_body_names_a_client_or_none(body, content_type, identity):
    request = RequestFactory().post("/", body.encode("latin-1", "surrogatepass")
                                    if body.startswith("\xff") else body,
                                    content_type=content_type)
    assert parse_key("post:username").identify(request) == identity
    assert request.body is not None  # the body is still there for the view


def test_a_json_body_is_read_only_for_a_post():
    request = RequestFactory().put("/", '{"username": "alice"}',
                                   content_type="application/json")
    assert parse_key("post:username").identify(request) is None


def test_a_json_body_too_big_for_django_is_a_key_failure_not_a_crash(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = json.dumps({"username": "alice", "pad": "x" * 2048})
    request = RequestFactory().post("/", body, content_type="application/json")
    with pytest.raises(IdentityError, match="RequestDataTooBig"):
        parse_key("post:username").identify(request)
