"""A login view, as a project has one (docs/recipes/login.md): Django's AuthenticationForm,
the page kept to the form so that the example needs no template."""

from django.contrib.auth import login
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import path


def sign_in(request):
    form = AuthenticationForm(request, data=request.POST if request.method == "POST" else None)
    if form.is_valid():
        login(request, form.get_user())
        return redirect("/")
    return HttpResponse(f'<form method="post">{form.as_div()}</form>')


urlpatterns = [path("accounts/login/", sign_in)]
