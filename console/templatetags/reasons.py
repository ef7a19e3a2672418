"""What a reason code means, wherever the console prints one (``tasks.reasons``, the one registry).

``{{ code|reason_code }}`` writes the code as the machine says it, in ``<code>``, then what it means for a
person (``tasks.reasons.meaning``); a code the registry does not know is shown alone, and an empty one
as "(no reason code)".
"""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from tasks import reasons

register = template.Library()


@register.filter
def reason_code(code: str | None) -> SafeString:
    if not code:
        return format_html("<code>{}</code>", "(no reason code)")
    meaning = reasons.meaning(code)
    if not meaning:
        return format_html("<code>{}</code>", code)
    return format_html('<code>{}</code> <span class="reason-meaning">{}</span>', code, meaning)
