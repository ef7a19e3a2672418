"""Settings, read from the environment (see README, "Configuration").

With nothing set, the project runs on an embedded SQLite file under ``var/``
for the demo. ``DATABASE_URL`` points it at PostgreSQL, which every
concurrency guarantee is written for and tested on.
"""

from __future__ import annotations

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
# A development key is only acceptable while DEBUG is on; production must set one.
SECRET_KEY = env.str("SECRET_KEY", default="dev-only-insecure-key" if DEBUG else environ.Env.NOTSET)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "guardian",
    "django_htmx",
    "tenancy",
    "audit",
    "tasks",
    "ledger",
    "approvals",
    "console",
    "sandbox",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'demo.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(exist_ok=True)
    # SQLite serialises writers. Taking the write lock when a transaction begins
    # (IMMEDIATE) lets a waiting writer queue on the busy timeout instead of
    # failing when a read-then-write transaction tries to upgrade its lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row; anonymous callers get nothing
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
if DEBUG:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request without it
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first so an unauthenticated API call answers 401 with WWW-Authenticate.
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["tasks.parsers.BoundedJSONParser"],
    "EXCEPTION_HANDLER": "tasks.api_errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Durable agent execution API",
    "VERSION": "1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_INCLUDE_SCHEMA": False,
}

# Identifies the code that is running; checkpoints record it, and a task resumed
# by another deployment goes through resume validation first.
DEPLOYMENT_ID = env.str("DEPLOYMENT_ID", default="dev")
# Region this process advances tasks for (workers claim only their region's tasks).
WORKER_REGION = env.str("WORKER_REGION", default="default")
# Policy version stamped on new tasks until policies live in the database.
DEFAULT_POLICY_VERSION = env.str("DEFAULT_POLICY_VERSION", default="2026-11")

# External systems. Each connector's base URL is CONNECTOR_<NAME>_URL; unset, it
# is the sandbox served by this project under /sandbox/<name>.
# The simulated systems under /sandbox/ (demo and tests); off by default in production.
SANDBOX_ENABLED = env.bool("SANDBOX_ENABLED", default=DEBUG)
SANDBOX_BASE_URL = env.str("SANDBOX_BASE_URL", default="http://127.0.0.1:8000/sandbox")
CONNECTOR_URLS = {
    key[len("CONNECTOR_") : -len("_URL")].lower(): value
    for key, value in os.environ.items()
    if key.startswith("CONNECTOR_") and key.endswith("_URL") and value
}
CONNECTOR_TIMEOUT = env.float("CONNECTOR_TIMEOUT", default=5.0)
# Which class serves each connector name; a new connector is one class and one line here.
LEDGER_CONNECTORS = {
    "payments": "ledger.connectors.http.HTTPConnector",
    "tickets": "ledger.connectors.http.HTTPConnector",
    "email": "ledger.connectors.http.HTTPConnector",
}
# An outcome still unknown after this long is escalated to an operator.
UNKNOWN_OUTCOME_ESCALATE_AFTER = env.float("UNKNOWN_OUTCOME_ESCALATE_AFTER", default=600.0)
# A runnable task nobody has leased, or a wait past its deadline, for this long is "stuck".
STUCK_AFTER = env.float("STUCK_AFTER", default=120.0)


# Celery: the doorbell. Unset, an embedded filesystem broker under var/broker.
BROKER_DIR = Path(env.str("BROKER_DIR", default=str(VAR_DIR / "broker")))
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for folder in ("queue", "processed"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = f"region.{WORKER_REGION}"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "tasks.sweep", "schedule": env.float("SWEEP_INTERVAL", default=5.0)},
    "expire-approvals": {"task": "approvals.expire_pending", "schedule": 30.0},
    "reconcile": {
        "task": "ledger.reconcile_unknown",
        "schedule": env.float("RECONCILE_INTERVAL", default=10.0),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = env.str(
    "CELERY_BEAT_SCHEDULE_FILENAME", default=str(VAR_DIR / "celerybeat-schedule")
)
LEASE_TTL_SECONDS = env.float("LEASE_TTL_SECONDS", default=30.0)

# The model behind "model turn" steps: the deterministic scripted model, or any
# OpenAI-compatible chat endpoint.
MODEL_BACKEND = env.str("MODEL_BACKEND", default="scripted")  # scripted | openai
MODEL_URL = env.str("MODEL_URL", default="")
MODEL_NAME = env.str("MODEL_NAME", default="")
MODEL_API_KEY = env.str("MODEL_API_KEY", default="")
MODEL_TIMEOUT = env.float("MODEL_TIMEOUT", default=30.0)

if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}
