"""A URLconf with the admin somewhere else than /admin/ (system check W004's test)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("backoffice/", admin.site.urls)]
