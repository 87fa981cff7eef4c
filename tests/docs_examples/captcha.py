# views.py and its URL: past five attempts in 15 minutes, the login form asks for a CAPTCHA
import random

from django.contrib.auth import login
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import path

from ratelimits.decorators import ratelimit


def new_challenge(request):
    """A question for the page, its answer kept in the session: stands in for your
    CAPTCHA provider's widget."""
    a, b = random.randint(1, 9), random.randint(1, 9)
    request.session["captcha_answer"] = str(a + b)
    return f"What is {a} + {b}?"


def challenge_passed(request):
    """Whether the form carries the right answer: stands in for your provider's check.
    An answer is good for one attempt."""
    expected = request.session.pop("captcha_answer", None)
    return expected is not None and request.POST.get("captcha", "").strip() == expected


def page(form, question=None):
    challenge = ""
    if question:
        challenge = f'<label>{question} <input name="captcha" required></label>'
    return HttpResponse(f'<form method="post">{form.as_div()}{challenge}</form>')


@ratelimit(name="login-challenge", rate="5/15m", key="ip", algorithm="sliding_log",
           methods="POST", block=False)
def sign_in(request):
    if request.method != "POST":
        return page(AuthenticationForm(request))
    if request.limited and not challenge_passed(request):
        # Past the limit: the form again, with a challenge; the password is not checked.
        form = AuthenticationForm(request, initial={"username": request.POST.get("username")})
        return page(form, new_challenge(request))
    form = AuthenticationForm(request, data=request.POST)
    if form.is_valid():
        login(request, form.get_user())
        return redirect("/")
    return page(form)


urlpatterns = [path("accounts/login/", sign_in)]
