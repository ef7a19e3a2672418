"""gunicorn's configuration for the web process (``gunicorn --config deploy/gunicorn.conf.py
config.wsgi:application``). Every knob is an environment variable, listed with its default in
docs/operating/settings.md: the bind address, processes, threads per process, and the request and shutdown
timeouts.

Threads, not more processes, carry the waiting: a console page or an API call spends most of its time on
PostgreSQL. A process silent for ``WEB_TIMEOUT`` seconds is restarted (gunicorn's ``timeout``); a gthread
worker's main loop keeps speaking while its threads serve, so a long request (an A2A stream, which holds
one thread for up to ``A2A_STREAM_MAX_SECONDS``) does not trip it. ``WEB_GRACEFUL_TIMEOUT`` is how long a
SIGTERM lets requests in flight finish.
"""

from __future__ import annotations

import os

bind = os.environ.get("WEB_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_WORKERS", "2"))
threads = int(os.environ.get("WEB_THREADS", "8"))
worker_class = "gthread"
timeout = int(os.environ.get("WEB_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT", "30"))
keepalive = 5
# The proxy in front terminates TLS and sets X-Forwarded-Proto (TRUST_X_FORWARDED_PROTO=1 in the app).
forwarded_allow_ips = os.environ.get("WEB_FORWARDED_ALLOW_IPS", "127.0.0.1")
accesslog = "-"
errorlog = "-"
