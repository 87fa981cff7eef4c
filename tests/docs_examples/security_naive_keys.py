"""A key function that trusts X-Forwarded-For, as too many snippets online do: the
left-most entry is taken as the client. docs/security.md shows a client walking past
a per-address limit keyed on it. Do not use it."""


def leftmost_forwarded_for(request):
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if forwarded:
        return forwarded.split(",")[0].strip()  # whatever the client wrote first
    return request.META.get("REMOTE_ADDR")
