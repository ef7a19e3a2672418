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
    # Layers, lowest first (the contract in pyproject.toml, checked by import-linter):
    "tenancy",
    "audit",
    "ledger",
    "tasks",
    "approvals",
    "runtime",
    "workflows",
    "console",
    "demo",
    "demo.sandbox",
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
LOGIN_REDIRECT_URL = "console:landing"  # approvers land on their inbox, others on the queue
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
    "DEFAULT_PARSER_CLASSES": ["api.parsers.BoundedJSONParser"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Durable agent execution API",
    "VERSION": "1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_INCLUDE_SCHEMA": False,
}

# Largest checkpoint body written or loaded. Checkpoints hold references and scalar
# facts, not documents: a bigger body is a blob that slipped in (or was planted).
CHECKPOINT_MAX_BYTES = env.int("CHECKPOINT_MAX_BYTES", default=256 * 1024)
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
    "orders": "ledger.connectors.http.HTTPConnector",  # evidence reads (runtime.evidence)
}
# The longest a sent request can take to land in the authoritative system, counted
# from the moment it was claimed for sending (our timeout plus however long the
# system may still commit after we gave up). A lookup that finds no effect is
# trusted as "absent" only once this much time has passed since the send.
CONNECTOR_MAX_IN_FLIGHT = env.float("CONNECTOR_MAX_IN_FLIGHT", default=60.0)
# Resending an effect found absent: exponential backoff with jitter from
# LEDGER_RESEND_BACKOFF seconds (doubling per send, at most LEDGER_RESEND_BACKOFF_MAX),
# and at most LEDGER_MAX_SENDS sends before an operator has to look.
LEDGER_RESEND_BACKOFF = env.float("LEDGER_RESEND_BACKOFF", default=5.0)
LEDGER_RESEND_BACKOFF_MAX = env.float("LEDGER_RESEND_BACKOFF_MAX", default=300.0)
LEDGER_MAX_SENDS = env.int("LEDGER_MAX_SENDS", default=5)
# The reconciler asks a system about the same action at most this often.
LEDGER_LOOKUP_INTERVAL = env.float("LEDGER_LOOKUP_INTERVAL", default=2.0)
# After a task ended with an effect found absent, keep asking about that effect
# (every LATE_EFFECT_RECHECK_EVERY seconds) for this long: a late landing amends the report.
LATE_EFFECT_WINDOW = env.float("LATE_EFFECT_WINDOW", default=86400.0)
LATE_EFFECT_RECHECK_EVERY = env.float("LATE_EFFECT_RECHECK_EVERY", default=60.0)
# An outcome still unknown after this long is escalated to an operator.
UNKNOWN_OUTCOME_ESCALATE_AFTER = env.float("UNKNOWN_OUTCOME_ESCALATE_AFTER", default=600.0)
# A runnable task nobody has leased, or a wait past its deadline, for this long is "stuck".
STUCK_AFTER = env.float("STUCK_AFTER", default=120.0)


# Celery: the doorbell. Unset, an embedded filesystem broker under var/broker.
BROKER_DIR = Path(env.str("BROKER_DIR", default=str(VAR_DIR / "broker")))
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for folder in ("queue", "processed", "control"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),  # not ./control in whatever directory we run from
        "store_processed": False,
        # It polls the folder, and also waits this long whenever every prefetch slot is busy: at
        # the default second a worker takes two doorbells a second, most of them the sweep's repeats.
        "polling_interval": 0.1,
    }
    # A transport without an event loop (this one polls) runs the prefork pool in its blocking form,
    # where all children read jobs from one pipe under one lock that an idle child holds while it
    # waits: SIGKILL that child (OOM killer, operator) and the lock is never released, so no child
    # runs anything again. Threads share no such lock, and agent steps are I/O-bound anyway.
    CELERY_WORKER_POOL = "threads"
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis (and SQS) hand a message left unacknowledged this long to another consumer: with
        # late acks, the doorbells of a worker that vanished come back after it. Longer than a
        # normal run, so that runs in progress are not rung twice (which would be harmless anyway:
        # the second doorbell finds the lease taken), far shorter than the default hour.
        "visibility_timeout": env.float("CELERY_VISIBILITY_TIMEOUT", default=300.0),
    }
# Redis: every key (queues, unacked messages, bindings, pub/sub) under this prefix, so that
# deployments (or test runs) sharing one Redis never see each other's messages.
if key_prefix := env.str("CELERY_BROKER_KEY_PREFIX", default=""):
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = key_prefix
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = f"region.{WORKER_REGION}"
# One message per pool process at a time: doorbells a worker cannot start yet stay in the broker,
# where any worker of the region can take them, instead of waiting behind a busy (or dying) one.
# Doorbells ack late and go back to the queue when their pool process dies (tasks/workers.py).
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
# Tasks one run_worker process keeps in flight (threads; see runtime/loop.py), and the database
# connections they share: a slot holds one only while it talks to the database, not while it
# waits on a model or an outside system.
WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=32)
WORKER_DB_CONNECTIONS = env.int("WORKER_DB_CONNECTIONS", default=0)  # 0: min(concurrency, 8) + 2
# Each worker process holds a PostgreSQL advisory lock while it lives, so the leases of a process
# that died are taken over at once instead of after their TTL (tasks/liveness.py). Turn it off
# behind a transaction-pooling proxy, where session locks mean nothing.
WORKER_LIVENESS = env.bool("WORKER_LIVENESS", default=True)

# The model behind "model turn" steps: the deterministic scripted model, or any
# OpenAI-compatible chat endpoint.
MODEL_BACKEND = env.str("MODEL_BACKEND", default="scripted")  # scripted | openai
MODEL_URL = env.str("MODEL_URL", default="")
MODEL_NAME = env.str("MODEL_NAME", default="")
MODEL_API_KEY = env.str("MODEL_API_KEY", default="")
MODEL_TIMEOUT = env.float("MODEL_TIMEOUT", default=30.0)
# The scripted model waits this long before answering, as a real model turn would (benchmarks, soak).
MODEL_LATENCY_MS = env.float("MODEL_LATENCY_MS", default=0.0)

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
