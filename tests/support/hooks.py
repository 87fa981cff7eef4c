"""Functions the tests name in settings and policies by dotted path."""

from django.http import HttpResponse


def exempt_health(request):
    return request.headers.get("X-Health") == "1"


def teapot(request, rejection):
    return HttpResponse(f"slow down: {','.join(rejection.policies)}", status=rejection.status)


def broken(request, rejection):
    raise RuntimeError("the reject view is broken")


def failing_key(request):
    raise ValueError("cannot identify")


def tenant_key(request):
    return request.headers["X-Tenant"]  # KeyError without the header: the key fails


def tenant(request):
    """A `call:` key: the account a request names."""
    return request.POST.get("username")


def exits(request):
    """A function of the request, of the right shape, that stops the process it runs in
    (as `sys.exit` would)."""
    raise SystemExit(f"exiting on {request.path}")


def exits_whatever_asked(request, *args):
    """An EXEMPT, TIER or REJECT_VIEW function (a REJECT_VIEW takes a second argument)
    that ends the process if let."""
    raise SystemExit(3)
