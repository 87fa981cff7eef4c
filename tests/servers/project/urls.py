"""The project's URLs: importing this module imports the views and their `@ratelimit`s,
which a server does at the first request it resolves, not before."""

from django.contrib import admin
from django.urls import path

from tests.servers.project import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("quote/", views.quote),
    path("login/", views.login),
    path("free/", views.free),
    path("api/upload/", views.Upload.as_view()),
]
