from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from config import otel

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
otel.configure()
application = get_asgi_application()
