"""Whether a value from outside can be stored: the one rule every entry point applies.

Values enter from four places — evidence records read over HTTP, external
events and input posted to the API, and model output — and end up in
PostgreSQL text and jsonb columns (checkpoints, outcomes, payloads, audit
reasons). PostgreSQL cannot hold some of what JSON and Python strings can:

- NUL (U+0000): text columns refuse it, jsonb refuses the ``\\u0000`` escape;
- lone surrogates (U+D800..U+DFFF): not valid UTF-8, so the text cannot even
  be encoded for the wire (psycopg raises ``UnicodeEncodeError``);
- NaN and infinities: not JSON, jsonb refuses them;
- nesting deeper than ``MAX_DEPTH``: refused by the API's parser already, and
  kept out here so nothing walking a value recurses without bound.

``check`` is the decision (it raises ``Unstorable`` naming where the bad value
sits and what is wrong with it); each entry point decides what a refusal means
for its source (a 400, a quarantine, a model turn tried again). ``printable``
turns any text into text that is always storable, for messages and reasons
that quote outside data.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_DEPTH = 64  # the API's parser refuses deeper bodies before building them (api.parsers)
MAX_QUOTED = 80  # how much of an offending key a message quotes

# Every code point PostgreSQL text cannot take. A Python str holding a surrogate
# code point holds a lone one: json.loads already joined every valid pair.
_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


class Unstorable(ValueError):
    """A value that cannot be stored; ``where`` is its path, ``problem`` what is wrong with it."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}" if where else problem)
        self.where = where
        self.problem = problem


def text_problem(text: str) -> str | None:
    """What keeps ``text`` out of a text column, or None when it is storable."""
    match = _UNSTORABLE_CHAR.search(text)
    if match is None:
        return None
    char = match.group()
    if char == "\x00":
        return f"contains a NUL character (at position {match.start()})"
    return f"contains a lone surrogate U+{ord(char):04X} (at position {match.start()})"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with NUL and lone surrogates written as escapes: always storable, always encodable."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return _UNSTORABLE_CHAR.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def check(value: Any, where: str = "value", *, max_depth: int = MAX_DEPTH) -> None:
    """Raise ``Unstorable`` unless ``value`` is JSON that PostgreSQL text and jsonb can hold.

    Walks keys and values of nested objects and arrays with an explicit stack
    (never recursion), reporting the first problem in document order with its
    path (``payload.items[2].name``).
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise Unstorable(path, problem)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise Unstorable(path, f"is {item}, not a JSON number")
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                raise Unstorable(path, f"is nested more than {max_depth} levels deep")
            children: list[tuple[Any, str, int]] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise Unstorable(path, f"has a key that is not text ({type(key).__name__})")
                    quoted = printable(key, MAX_QUOTED)
                    problem = text_problem(key)
                    if problem:
                        raise Unstorable(path, f"has a key '{quoted}' that {problem}")
                    children.append((child, f"{path}.{quoted}", depth + 1))
            else:
                children = [(child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item)]
            stack.extend(reversed(children))  # popped in document order
        else:
            raise Unstorable(path, f"is a {type(item).__name__}, not a JSON value")


def is_storable(value: Any) -> bool:
    try:
        check(value)
    except Unstorable:
        return False
    return True
