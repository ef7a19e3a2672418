"""Filters of the task page (``{% load task_page %}``)."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.safestring import SafeString

from console import task_page

register = template.Library()


@register.filter
def stamp(value: datetime | None) -> SafeString | str:
    """A moment in the page's one format, with its time zone (``console.task_page.stamp``)."""
    return task_page.stamp(value)
