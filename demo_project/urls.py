from django.contrib import admin
from django.urls import include, path

from demo_project.demo import views

urlpatterns = [
    path("", views.index, name="index"),
    path("hello/", views.hello, name="hello"),
    path("search/", views.search, name="search"),
    path("shop/", views.shop, name="shop"),
    path("slow/", views.slow, name="slow"),
    path("busy/", views.busy, name="busy"),
    path("quote/", views.quote, name="quote"),
    path("report/", views.report, name="report"),
    path("forecast/", views.forecast, name="forecast"),
    path("api/items/", views.ItemList.as_view(), name="items"),
    path("admin/", admin.site.urls),
    path("ratelimits/", include("ratelimits.urls")),  # /ratelimits/metrics/ for Prometheus
]
