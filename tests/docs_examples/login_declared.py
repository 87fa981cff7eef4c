# urls.py: the login view with its two limits declared in code
from django.urls import path

from ratelimits.decorators import ratelimit
from tests.docs_examples.login import sign_in

per_address = ratelimit(name="login-form-per-address", rate="10/m", key="ip",
                        algorithm="sliding_log", methods="POST")
per_username = ratelimit(name="login-form-per-username", rate="5/15m", key="post:username",
                         algorithm="sliding_log", methods="POST")

urlpatterns = [path("accounts/login/", per_address(per_username(sign_in)))]
