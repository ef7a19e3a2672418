from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from config import otel

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
otel.configure()
application = get_wsgi_application()
