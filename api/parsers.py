"""The API's only request parser: JSON that PostgreSQL can store, with a nesting limit.

Python's json module recurses per nesting level; a body nested thousands deep
would raise RecursionError (a 500) there or in any code that walks the value
afterwards. Anything deeper than ``MAX_DEPTH`` is refused as a 400.

JSON can also carry text no database column takes: NUL (``\\u0000``) and lone
surrogates (``\\ud800`` without its pair), in values and in object keys, at any
depth. Every endpoint gets its body from here, so refusing them here (a 400
naming where and what, from ``tasks.values``, the one rule) means no view can
reach the database with one and answer a 500. For an object body the 400 has
a serializer's shape, ``{"<field>": ["<field>.<path> has ..."]}``.
"""

from __future__ import annotations

import json

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from tasks import values
from tasks.values import MAX_DEPTH


def _too_deep(text: str) -> bool:
    """Bracket depth outside strings, without building anything."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif char in "]}":
            depth -= 1
    return False


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if _too_deep(text):
            raise ParseError(f"JSON nested more than {MAX_DEPTH} levels deep")
        try:
            parsed = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        _refuse_unstorable(parsed)
        return parsed


def _refuse_unstorable(parsed: object) -> None:
    """400 for text no database column can hold, named by field (``tasks.values.check``)."""
    if not isinstance(parsed, dict):
        try:
            values.check(parsed, "body")
        except values.Unstorable as exc:
            raise ParseError(f"JSON refused: {exc}") from None
        return
    for key, value in parsed.items():
        if problem := values.text_problem(key):
            quoted = values.printable(key, values.MAX_QUOTED)
            raise ParseError(f"JSON refused: the body has a key '{quoted}' that {problem}")
        try:
            values.check(value, key)
        except values.Unstorable as exc:
            raise ValidationError({key: [str(exc)]}) from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
