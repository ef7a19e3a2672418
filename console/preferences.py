"""Per-browser display preferences: the light/dark theme.

A cookie, not the session: the choice survives logging out (the login page
keeps it) and needs no database row. A plain form POST sets it, so the toggle
works without JavaScript; ``base.html`` reads the cookie and CSS does the rest.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

THEME_COOKIE = "theme"
# "auto" follows the browser's prefers-color-scheme: it is the absence of the cookie.
THEMES = ("auto", "light", "dark")
ONE_YEAR = 365 * 24 * 3600


@login_required
@require_POST
def theme(request: HttpRequest) -> HttpResponse:
    choice = request.POST.get("theme", "auto")
    back = request.POST.get("next", "")
    # Only back to a page of this site: ``next`` comes from the form and could be anything.
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = "/console/"
    response = HttpResponseRedirect(back)
    if choice in ("light", "dark"):
        response.set_cookie(THEME_COOKIE, choice, max_age=ONE_YEAR, samesite="Lax", httponly=True)
    else:
        response.delete_cookie(THEME_COOKIE, samesite="Lax")
    return response
