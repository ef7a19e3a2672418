"""Every HTML answer shows invisible and direction-changing characters instead of obeying them.

A right-to-left override (U+202E), an isolate (U+2066–U+2069), a zero-width space or a byte order
mark in an objective, a reason, a comment or a saved view's name reordered or hid what the audit
history, audit search, alerts and bulk report pages showed. A filter on each template variable
misses whatever a template, a form widget or a message draws without it; this is the one hook all
of them pass: ``console.templatetags.invisibles.show_in_html`` on the rendered page.

Listed after ``CommonMiddleware`` (which sets ``Content-Length`` from what this leaves) and before
axes' lockout page, so that page is covered too. Streamed answers (CSV and JSON exports) and
anything but HTML are data, and left as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from console.templatetags.invisibles import show_in_html


class ShowInvisibleCharacters:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.streaming
            or not response.get("Content-Type", "").startswith("text/html")
            or response.has_header("Content-Encoding")
        ):
            return response
        charset = response.charset or "utf-8"
        try:
            page = response.content.decode(charset)
        except (UnicodeDecodeError, LookupError):
            return response
        shown = show_in_html(page)
        if shown is not page:
            response.content = shown.encode(charset)
            if response.has_header("Content-Length"):
                response["Content-Length"] = str(len(response.content))
        return response
