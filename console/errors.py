"""The console's conflict answer: a 409 page in the console layout.

Django has handlers for 403/404/500 (their templates are ``templates/403.html``
and friends); a conflict is the console's own: a view that catches
``StaleVersion`` (or another "someone changed it first") and has no better
place to say so renders this instead of a bare error.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def conflict(request: HttpRequest, *, detail: str, back_url: str, back_label: str) -> HttpResponse:
    """The 409 page: what changed (``detail``) and a link back to where to review it."""
    context = {"detail": detail, "back_url": back_url, "back_label": back_label}
    return render(request, "409.html", context, status=409)
