"""How long the API's parser takes to refuse a body built to cost server time (issue 20, item 6).

``python bench/parser.py``: no database, no server. Times ``api.parsers.BoundedJSONParser`` on a
2.3 MB task start with 200,000 keys in its input (refused: more than ``MAX_KEYS``), on one nested
deeper than ``MAX_DEPTH`` and on an ordinary task start; prints the median of ``RUNS`` tries each.
Before the key limit the 200,000-key body was parsed, validated and answered with 8.9 MB of errors
in 11–13 s of server time; the issue asks for a refusal in under 100 ms.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "1")  # a public development key will do: nothing is stored

RUNS = 9


def body(input_value: object) -> bytes:
    return json.dumps({"task_type": "refund_request", "objective": "x", "input": input_value}).encode()


def median_ms(parse, raw: bytes) -> tuple[float, str]:
    took, outcome = [], ""
    for _ in range(RUNS):
        started = time.perf_counter()
        try:
            parse(io.BytesIO(raw))
            outcome = "parsed"
        except Exception as exc:  # the refusal is the point: its type and message are printed
            outcome = f"{type(exc).__name__}: {exc}"
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took), outcome


def main() -> None:
    import django

    django.setup()
    from api.parsers import BoundedJSONParser

    parse = BoundedJSONParser().parse
    cases = {
        "200,000 keys": body({str(n): 0 for n in range(200_000)}),
        "nested 10,000 deep": b'{"input": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        "an ordinary task start": body({"order_id": "A-1", "amount": "10.00", "currency": "USD"}),
    }
    print(f"| body | bytes | median ms ({RUNS} runs) | outcome |\n|---|---|---|---|")
    for name, raw in cases.items():
        ms, outcome = median_ms(parse, raw)
        print(f"| {name} | {len(raw):,} | {ms:.1f} | {outcome[:70]} |")


if __name__ == "__main__":
    main()
