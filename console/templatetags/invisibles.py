"""``{{ text|visible }}``: invisible and direction-changing characters, written out.

``{% load invisibles %}``.

Text from tasks, records and models reaches approvers and operators on the task and approval pages.
Some characters draw nothing yet change what is seen: U+202E (right-to-left override) makes
``visa-\\u202e4321`` read as ``visa-1234``, the isolates and embeddings reorder what follows, a
zero-width space splits a word that looks whole. Each such character is shown as its code point,
``⟨U+202E⟩``, in a marked span naming it, so what an approver reads is what the task holds.

Shown: every control (Unicode category Cc) but tab, newline and carriage return, every format
character (Cf: the bidi controls U+202A–U+202E and U+2066–U+2069, U+200B–U+200F, U+FEFF, the soft
hyphen...), the line and paragraph separators (Zl, Zp), and unassigned, private-use and surrogate
code points. Everything else, and every value that is not text, is left as it was.

The filter marks what a template names; ``show_in_html`` does the same to a whole rendered page,
and ``console.middleware.ShowInvisibleCharacters`` runs it on every HTML answer, so text reaches
no page raw whichever template, form widget or message draws it (the audit history and search,
alerts and bulk reports drew objectives, reasons and comments raw). In text the character becomes
the marked span; inside a tag (an attribute value), a comment, ``<script>``, ``<style>``,
``<textarea>`` or ``<title>`` — where markup is not markup — the plain ``⟨U+202E⟩``.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeData, SafeString, mark_safe

register = template.Library()

KEPT = frozenset("\t\n\r")
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cn", "Co", "Cs"})


@lru_cache(maxsize=4096)
def is_hidden(char: str) -> bool:
    return char not in KEPT and unicodedata.category(char) in HIDDEN_CATEGORIES


def marker(char: str) -> str:
    """How a hidden character is written: ``⟨U+202E⟩``."""
    return f"⟨U+{ord(char):04X}⟩"


def has_hidden(text: str) -> bool:
    # str.isprintable() is False for every character shown here (and for spaces other than ' '):
    # the common case, printable text, costs one C-level scan.
    return not text.isprintable() and any(is_hidden(char) for char in text)


@register.filter(needs_autoescape=True)
def visible(value: Any, autoescape: bool = True) -> Any:
    """``value`` with each hidden character replaced by a marked ``⟨U+XXXX⟩``; non-text unchanged."""
    if not isinstance(value, str) or not has_hidden(value):
        return value
    already_safe = isinstance(value, SafeData)
    parts: list[str] = []
    run: list[str] = []
    for char in value:
        if not is_hidden(char):
            run.append(char)
            continue
        parts.append(_escaped("".join(run), autoescape and not already_safe))
        run = []
        parts.append(_span(char))
    parts.append(_escaped("".join(run), autoescape and not already_safe))
    return mark_safe("".join(parts))  # every piece is escaped above or built by format_html


def _escaped(text: str, escape: bool) -> SafeString | str:
    return conditional_escape(text) if escape else text


def _span(char: str) -> SafeString:
    name = unicodedata.name(char, "unnamed character").lower()
    return format_html('<span class="invisible-char" title="{}">{}</span>', name, marker(char))


# Anything but printable ASCII and the kept whitespace: the few characters ``is_hidden`` must look at.
_CANDIDATE = re.compile(r"[^\t\n\r\x20-\x7e]")
# Where a span would not be markup: comments, raw-text and escapable raw-text elements, tags.
_NOT_TEXT = re.compile(r"<!--.*?-->|<(script|style|textarea|title)\b[^>]*>.*?</\1\s*>|<[^>]*>", re.S | re.I)


def _written_out(text: str, *, as_span: bool) -> str:
    def replace(match: re.Match[str]) -> str:
        char = match.group()
        if not is_hidden(char):
            return char
        return _span(char) if as_span else marker(char)

    return _CANDIDATE.sub(replace, text)


def show_in_html(document: str) -> str:
    """A rendered page with every hidden character written out: the marked span in text, the plain
    marker in tags, comments and raw-text elements. A page without one is returned as it is."""
    if not any(is_hidden(match.group()) for match in _CANDIDATE.finditer(document)):
        return document
    parts: list[str] = []
    done = 0
    for match in _NOT_TEXT.finditer(document):
        parts.append(_written_out(document[done : match.start()], as_span=True))
        parts.append(_written_out(match.group(), as_span=False))
        done = match.end()
    parts.append(_written_out(document[done:], as_span=True))
    return "".join(parts)
