"""What the shared layout (``base.html``) needs to know about the page it frames."""

from __future__ import annotations

from django import template
from django.http import HttpRequest
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Navigation section of each console URL name (the rest of a name's section is its prefix).
SECTIONS = {
    "queue": "queue",
    "task": "queue",
    "task-control": "queue",
    "approvals": "approvals",
    "approval": "approvals",
    "approval-decide": "approvals",
    "quarantine": "quarantine",
    "access": "access",
    "orphans": "orphans",
    "dashboard": "dashboard",
    "task-types": "task-types",
}


@register.simple_tag(takes_context=True)
def nav_current(context: template.Context, section: str, href: str) -> SafeString | str:
    """``aria-current`` for a nav link: "page" on the page itself, "true" anywhere else in its section."""
    request: HttpRequest | None = context.get("request")
    match = getattr(request, "resolver_match", None)
    if request is None or match is None or match.namespace != "console":
        return ""
    name = match.url_name or ""
    here = SECTIONS.get(name) or ("audit" if name.startswith("audit") else "")
    if name.startswith("bulk"):
        here = "queue"
    if here != section:
        return ""
    # Constant markup, nothing from the request.
    return mark_safe('aria-current="page"' if request.path == href else 'aria-current="true"')


@register.simple_tag(takes_context=True)
def theme(context: template.Context) -> str:
    """The theme chosen with the toggle ("light" or "dark"), or "auto" to follow the browser."""
    request: HttpRequest | None = context.get("request")
    chosen = request.COOKIES.get("theme", "") if request is not None else ""
    return chosen if chosen in ("light", "dark") else "auto"
