"""A stand-in authoritative system serving records it may not be able to store itself.

The sandbox keeps records in a PostgreSQL JSON column, which cannot hold a NUL
or a lone surrogate; real systems can send both. This is a real HTTP server
on 127.0.0.1 (port 0, a thread) answering ``GET /records/<id>`` with exactly
the JSON text it was given, so evidence reads go through the real client.
Point a connector at it with ``CONNECTOR_<NAME>_URL`` (or ``settings.CONNECTOR_URLS``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote


class RecordServer:
    """Records by id, each kept as the raw JSON text to send."""

    def __init__(self) -> None:
        self.url = ""
        self.bodies: dict[str, str] = {}

    def put(self, record_id: str, data: dict[str, Any], *, version: Any = 1) -> None:
        """Serve ``data`` as record ``record_id`` (NUL goes out as ``\\u0000``, as real systems send it)."""
        self.bodies[record_id] = json.dumps({"id": record_id, "version": version, "data": data})

    def put_raw(self, record_id: str, text: str) -> None:
        self.bodies[record_id] = text


def _handler_for(records: RecordServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            prefix = "/records/"
            body = None
            if self.path.startswith(prefix):
                body = records.bodies.get(unquote(self.path[len(prefix) :]))
            payload = (body if body is not None else '{"detail": "not found"}').encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base class signature)
            pass  # keep pytest's output clean

    return Handler


@contextmanager
def record_server() -> Iterator[RecordServer]:
    records = RecordServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(records))
    server.daemon_threads = True
    records.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll interval so shutdown() at teardown returns at once.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield records
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
