"""Filters for the task-types page (``templates/console/task_types.html``)."""

from __future__ import annotations

from datetime import timedelta

from django import template

from reads.task_types import duration

register = template.Library()


@register.filter
def seconds_in_words(seconds: int) -> str:
    """``86400`` → "a day" (as the contract's own summaries say it); "" for 0."""
    return duration(timedelta(seconds=seconds)) if seconds else ""
