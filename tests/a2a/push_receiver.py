"""A push receiver on loopback for the tests: a small threaded HTTP server that records each POST.

``fail_first`` answers 500 to that many requests before accepting; ``always_fail`` never accepts;
``delay`` seconds pass before each answer (a slow receiver).
``unique()`` is what a receiver keeps after deduplicating on the idempotency id, in arrival order.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from interop import push


@dataclass
class Received:
    idempotency_id: str
    body: bytes
    headers: dict[str, str]

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    fail_first: int = 0
    always_fail: bool = False
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if receiver.delay:
                    time.sleep(receiver.delay)
                with receiver.lock:
                    failing = receiver.always_fail or len(receiver.answered) < receiver.fail_first
                    code = 500 if failing else 200
                    receiver.answered.append(code)
                    if not failing:
                        receiver.received.append(
                            Received(self.headers[push.IDEMPOTENCY_HEADER], body, dict(self.headers))
                        )
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def unique(self) -> list[Received]:
        seen: dict[str, Received] = {}
        with self.lock:
            for item in self.received:
                seen.setdefault(item.idempotency_id, item)
        return list(seen.values())
