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

Width costs as much as depth: 200,000 keys in 2.3 MB took 11–13 s to validate and answered an
8.9 MB list of errors. A body with more than ``MAX_KEYS`` object members in all is refused here,
before anything is built. Both limits are counted on the text with C-speed string operations
(strings blanked out by one regular expression; then ``:`` is exactly one per member, and the
brackets give the depth), so the refusal costs a scan of the bytes, not a parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import IO, Any, NoReturn

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from tasks import values
from tasks.values import MAX_DEPTH

MAX_KEYS = 10_000  # object members in a whole body; task inputs and payloads hold dozens

# A JSON string, escapes included (the unrolled form: no backtracking on long strings).
_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


def _too_big(text: str) -> str | None:
    """Why ``text`` is too deep or too wide to parse, or None; nothing is built to find out."""
    structure = _STRING_RE.sub("", text)
    if (keys := structure.count(":")) > MAX_KEYS:
        return f"JSON has more than {MAX_KEYS} keys ({keys})"
    brackets = _NOT_BRACKET_RE.sub("", structure)
    if brackets and max(accumulate(map(_NESTING.__getitem__, brackets))) > MAX_DEPTH:
        return f"JSON nested more than {MAX_DEPTH} levels deep"
    return None


class BoundedJSONParser(JSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:  # any JSON value: the stubs say a dict, but a body may be a list or a scalar
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            text = stream.read().decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if problem := _too_big(text):
            raise ParseError(problem)
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


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")
