"""The API's only request parser: JSON, with a nesting limit.

Python's json module recurses per nesting level; a body nested thousands deep
would raise RecursionError (a 500) there or in any code that walks the value
afterwards. Anything deeper than ``MAX_DEPTH`` is refused as a 400.

What a parsed value may hold (no NUL, no lone surrogate, no NaN) is decided
per field by ``tasks.values``, with the same depth bound, so the 400 can name
the field.
"""

from __future__ import annotations

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

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
            return json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
