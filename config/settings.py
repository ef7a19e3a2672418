"""Settings, read from the environment (see docs/operating/settings.md).

With nothing set, the project runs on an embedded SQLite file under ``var/``
(``VAR_DIR``) for the demo. ``DATABASE_URL`` points it at PostgreSQL, which every
concurrency guarantee is written for and tested on.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config import db_router, dsn, external

env = environ.Env()

BASE_DIR = Path(__file__).resolve().parent.parent
# What the process writes (the SQLite file, collected static files, the embedded broker, anchors, the
# beat schedule): beside the code in a checkout; an installed copy points it outside site-packages.
VAR_DIR = Path(env.str("VAR_DIR", default=str(BASE_DIR / "var")))

# Safe by default (docs/operating/settings.md): with no environment this is production — DEBUG off,
# and no start without a SECRET_KEY. Development says so explicitly (DEBUG=1; `make demo` does).
DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Production needs one (50 or more random characters); for a "
            "development run set DEBUG=1, which allows a public development key (make demo sets both)."
        )
    SECRET_KEY = "dev-only-insecure-key"  # public: acceptable only because DEBUG=1 was asked for
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
    "drf_spectacular",
    "guardian",
    "django_htmx",
    "axes",  # login throttling and lockout (AXES_* below)
    "csp",  # Content-Security-Policy (CONTENT_SECURITY_POLICY below)
    # The second factor of approvers and admins: TOTP devices and recovery codes (OTP_* below).
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    # Layers, lowest first (the contract in pyproject.toml, checked by import-linter):
    "tenancy",
    "audit",
    "ledger",
    "tasks",
    "approvals",
    "protection",  # data protection: retention, legal holds, reveal, key rotation
    "interop",  # A2A: the state mapping, the wire format, callers' messages and push notifications
    "runtime",
    "workflows",
    "console",
    "a2a_api",  # the A2A v1.0 JSON-RPC surface
    "demo",
    "demo.sandbox",
]

MIDDLEWARE = [
    # First: every line a request logs carries the task it is about (config/logging.py).
    "config.logging.LogContextMiddleware",
    # /healthz and /readyz, answered before host validation and the HTTPS redirect (config/health.py).
    "config.health.HealthMiddleware",
    # A view's query meeting a database outage (failover, restart, read-only) answers 503 with
    # Retry-After, not 500 (config/outage.py; its handler500 covers the middleware below).
    "config.outage.DatabaseOutageMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # After auth and messages: ends idle or too old sessions (SESSION_*_TIMEOUT below), and marks every
    # response to a signed-in user no-store (config/middleware.py).
    "config.middleware.SessionTimeoutMiddleware",
    "config.middleware.NoStoreForUsersMiddleware",
    # After the session limits: a session of an approver or admin opens nothing but the second-factor
    # pages until it has given its code (tenancy/second_factor.py; it reads the session's device).
    "tenancy.second_factor.SecondFactorMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Every HTML page shows invisible and bidi characters as ⟨U+202E⟩ (console/middleware.py).
    "console.middleware.ShowInvisibleCharacters",
    # With DATABASE_REPLICA_URL: the read-only pages may read the replica; after a write, the caller's next
    # pages wait for it to replay that write or read the primary (config/db_router.py). After the session
    # and authentication middleware: it keeps the caller's position in their session.
    "config.db_router.ReplicaReadsMiddleware",
    # Last: turns a lockout flagged during authentication into the lockout page (AXES_LOCKOUT_TEMPLATE).
    "axes.middleware.AxesMiddleware",
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
    # Several hosts (a failover cluster): libpq finds the writer (config/dsn.py).
    "default": dsn.database_settings(
        env, env.str("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'demo.sqlite3'}")
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # SQLite serialises writers. Taking the write lock when a transaction begins
    # (IMMEDIATE) lets a waiting writer queue on the busy timeout instead of
    # failing when a read-then-write transaction tries to upgrade its lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
# What sits between the processes and PostgreSQL: `none` (a direct connection, or a pooler in session
# mode) or `transaction` (PgBouncer with pool_mode = transaction): then no server-side cursors and no
# automatic prepared statements, nothing that must outlive a transaction (config/dsn.py).
DATABASE_POOLER = env.str("DATABASE_POOLER", default="none")
dsn.pooled(DATABASES["default"], DATABASE_POOLER)
# A direct PostgreSQL URL, never through a transaction pooler, for the workers' liveness locks alone
# (tasks/liveness.py): a session-level lock must live on a session of its own. Empty: DATABASE_URL.
DATABASE_LIVENESS = dsn.liveness_settings(env, env.str("DATABASE_LIVENESS_URL", default=""))
# A partitioned peer given up on within seconds, not the kernel's minutes or hours: by our end always, by
# the server's too where nothing pools in between (config/dsn.py, detect_dead_peers).
dsn.detect_dead_peers(DATABASES["default"], server=DATABASE_POOLER == "none")
if DATABASE_LIVENESS is not None:
    dsn.detect_dead_peers(DATABASE_LIVENESS, server=True)
# A streaming standby of the primary for the read-only pages of the console and the API (config/db_router.py):
# they read it while it has replayed the caller's last write and lags at most DATABASE_REPLICA_MAX_LAG
# seconds, else the primary. Empty: everything reads the primary. Workers, transitions and decisions never
# read it; migrations never run on it.
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
DATABASE_REPLICA_MAX_LAG = env.float("DATABASE_REPLICA_MAX_LAG", default=5.0)
if DATABASE_REPLICA_MAX_LAG < 0:
    raise ImproperlyConfigured("DATABASE_REPLICA_MAX_LAG must be 0 or more seconds")
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = db_router.replica_settings(
        DATABASES["default"],
        dsn.database_settings(env, DATABASE_REPLICA_URL),
        DATABASE_POOLER,
        DATABASE_REPLICA_URL,
    )
    dsn.pooled(DATABASES["replica"], DATABASE_POOLER)
    dsn.detect_dead_peers(DATABASES["replica"], server=DATABASE_POOLER == "none")
    DATABASE_ROUTERS = ["config.db_router.ReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username+address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row; anonymous callers get nothing
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "console:landing"  # approvers land on their inbox, others on the queue
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Login throttling (django-axes): AXES_FAILURE_LIMIT wrong passwords for one username from one
# address lock that pair out for AXES_COOLOFF_MINUTES (each further try restarts the wait); a
# successful login clears the count. Attempts live in the database, so every process sees them.
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("AXES_COOLOFF_MINUTES", default=15.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"  # answered with 429
AXES_DISABLE_ACCESS_LOG = True  # logins are recorded once, in tenancy's access log
# The client address is REMOTE_ADDR: a forwarded-for header is the client's to forge.
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]

# The second factor (django-otp, tenancy/second_factor.py). A wrong code counts toward the lockout
# above; each device also waits 1, 2, 4, 8... seconds after consecutive wrong codes, kept in the
# database (so a new password login does not reset it). The issuer names the account in the app.
OTP_TOTP_ISSUER = env.str("OTP_TOTP_ISSUER", default="Durable agents")
OTP_TOTP_THROTTLE_FACTOR = 1
OTP_STATIC_THROTTLE_FACTOR = 1

# The cache holds API throttle counters, which must be shared by every web process: set CACHE_URL
# to Redis (redis://host:6379/1) or Memcached (pymemcache://host:11211). Unset, a per-process memory
# cache: right for the one-process demo only. The counters are atomic increments (config.throttling);
# the database and file caches increment by read-then-write, which concurrent callers pass together.
CACHES = {"default": env.cache("CACHE_URL", default="locmemcache://")}
_NOT_ATOMIC = ("DatabaseCache", "FileBasedCache", "DummyCache")
if CACHES["default"]["BACKEND"].rsplit(".", 1)[-1] in _NOT_ATOMIC:
    raise ImproperlyConfigured(
        f"CACHE_URL names {CACHES['default']['BACKEND']}, whose increments are not atomic, so the API "
        "throttles would not hold under concurrent callers: use redis:// or pymemcache://"
    )

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves static files in every mode. By default straight from their sources (its finders),
# so DEBUG=0 works with no build step. A production build runs `manage.py collectstatic` and sets
# STATICFILES_COLLECTED=1: hashed, compressed copies from STATIC_ROOT, cached by browsers for good.
STATICFILES_COLLECTED = env.bool("STATICFILES_COLLECTED", default=False)
WHITENOISE_USE_FINDERS = not STATICFILES_COLLECTED
if not STATICFILES_COLLECTED:
    with contextlib.suppress(OSError):  # a read-only tree only costs WhiteNoise's warning
        STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request without it
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if STATICFILES_COLLECTED
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first so an unauthenticated API call answers 401 with WWW-Authenticate.
        "api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Roles are checked by each view; a token is further held to its scopes (api.auth.TokenScopes).
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "api.auth.TokenScopes"],
    # 429 with Retry-After past these rates: per user, and per address for anonymous callers and
    # for wrong tokens (api.auth). Counted atomically in the cache (config.throttling; CACHES: shared
    # only when CACHE_URL is set).
    "DEFAULT_THROTTLE_CLASSES": ["config.throttling.AnonRateThrottle", "config.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("API_THROTTLE_ANON", default="60/min"),
        "user": env.str("API_THROTTLE_USER", default="600/min"),
    },
    "NUM_PROXIES": 0,  # the throttles' address is REMOTE_ADDR, never a client-supplied X-Forwarded-For
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
    # The schema is served like every other API answer: signed in, or a token with the read scope.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated", "api.auth.TokenScopes"],
}

# Largest checkpoint body written or loaded. Checkpoints hold references and scalar
# facts, not documents: a bigger body is a blob that slipped in (or was planted).
CHECKPOINT_MAX_BYTES = env.int("CHECKPOINT_MAX_BYTES", default=256 * 1024)
# Largest item an agent's session memory takes (runtime.sdk.session; its canonical JSON, in bytes):
# a conversation turn, not a document. A bigger one is refused whole, with the batch it came in.
AGENT_SESSION_ITEM_MAX_BYTES = env.int("AGENT_SESSION_ITEM_MAX_BYTES", default=64 * 1024)
# Keys sealing sensitive fields (audit.sealing): "id:key,id2:key2", urlsafe-base64 Fernet keys; the
# first seals, every one opens. Never stored in the database. Unset: a public development key with
# DEBUG on or under the tests; otherwise start-up refuses (task types mark fields sensitive).
FIELD_ENCRYPTION_KEYS = env.str("FIELD_ENCRYPTION_KEYS", default="")
# External events one task keeps at most; a new key beyond this is a 409 (repeats still answer).
EXTERNAL_EVENTS_MAX_PER_TASK = env.int("EXTERNAL_EVENTS_MAX_PER_TASK", default=1000)
# Tamper evidence (audit/keys.py, audit/anchor.py; docs/operating/tamper-evidence.md). Never in the database.
# AUDIT_HMAC_KEYS: "id:secret,id2:secret2", the first keys new audit events, every one verifies.
# AUDIT_ANCHOR_KEY: base64 Ed25519 seed signing anchors; AUDIT_ANCHOR_PUBLIC_KEYS: more keys whose
# anchors verify. Unset: public development keys with DEBUG on or under the tests only.
AUDIT_HMAC_KEYS = env.str("AUDIT_HMAC_KEYS", default="")
AUDIT_ANCHOR_KEY = env.str("AUDIT_ANCHOR_KEY", default="")
AUDIT_ANCHOR_PUBLIC_KEYS = env.list("AUDIT_ANCHOR_PUBLIC_KEYS", default=[])
# AUDIT_EXPORT_KEY: base64 Ed25519 seed signing history exports on hosts that do not hold the anchor key
# (the web tier in production). Unset: exports are signed with the anchor key where the host holds it.
AUDIT_EXPORT_KEY = env.str("AUDIT_EXPORT_KEY", default="")
# No start without them outside development, like SECRET_KEY (docs/operating/production.md): every transition
# is chained under AUDIT_HMAC_KEYS, every anchor signed (or, on a host that only verifies, checked) with
# the anchor keys. Their format is checked at start-up by audit.apps.
_missing_audit_keys = [
    name
    for name, value in (
        ("AUDIT_HMAC_KEYS", AUDIT_HMAC_KEYS),
        ("AUDIT_ANCHOR_KEY", AUDIT_ANCHOR_KEY or ",".join(AUDIT_ANCHOR_PUBLIC_KEYS)),
    )
    if not value.strip()
]
if _missing_audit_keys and not DEBUG:
    raise ImproperlyConfigured(
        f"{' and '.join(_missing_audit_keys)} not set: production keeps tamper evidence under its own keys "
        "(docs/operating/tamper-evidence.md; `DEBUG=1 python manage.py audit_anchor --generate-key` prints "
        "an anchor key pair). For a development run set DEBUG=1, which allows public development keys."
    )
AUDIT_ANCHOR_DIR = Path(env.str("AUDIT_ANCHOR_DIR", default=str(VAR_DIR / "anchors")))
# The longest an event goes unanchored (seconds): an anchor is written once the newest is this old,
# and within a minute of a consequential transition (audit.anchor.anchor_if_due).
AUDIT_ANCHOR_INTERVAL = env.float("AUDIT_ANCHOR_INTERVAL", default=900.0)
# Retention (protection/retention.py; docs/operating/retention.md): days after a task ended until its
# sealed values are erased (archive) and until it is deleted with a tombstone, where no RetentionPolicy of
# its tenant says otherwise; 0: never. Deleting needs the database owner role
# (docs/operating/tamper-evidence.md#database-roles).
RETENTION_ARCHIVE_AFTER_DAYS = env.int("RETENTION_ARCHIVE_AFTER_DAYS", default=30)
RETENTION_DELETE_AFTER_DAYS = env.int("RETENTION_DELETE_AFTER_DAYS", default=365)
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
SANDBOX_ENABLED = env.bool("SANDBOX_ENABLED", default=False)
# Every sandbox call carries `Authorization: Bearer <SANDBOX_TOKEN>` (401 otherwise); connectors left
# pointing at the sandbox send it. A development run has a public default; production sets its own.
SANDBOX_TOKEN = env.str("SANDBOX_TOKEN", default="dev-only-sandbox-token" if DEBUG else "")
if SANDBOX_ENABLED and not SANDBOX_TOKEN:
    raise ImproperlyConfigured("SANDBOX_ENABLED=1 with DEBUG off needs SANDBOX_TOKEN (a random secret).")
SANDBOX_BASE_URL = env.str("SANDBOX_BASE_URL", default="http://127.0.0.1:8000/sandbox")
# Per connector (config/external.py): CONNECTOR_<NAME>_URL, _TOKEN (sent as a bearer token; on the
# sandbox it defaults to SANDBOX_TOKEN), _HEADERS (a JSON object) and _PUBLIC_URL (the base of the
# evidence links approvers open; default the URL). A URL holding user:pass@ is refused at start-up.
CONNECTOR_URLS = external.connector_values(os.environ, "_URL")
CONNECTOR_TOKENS = external.connector_values(os.environ, "_TOKEN")
CONNECTOR_HEADERS = external.connector_headers(os.environ)
CONNECTOR_PUBLIC_URLS = external.connector_values(os.environ, "_PUBLIC_URL")
external.refuse_credentials_in_urls(os.environ)
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

# Metrics at /metrics (config/metrics.py): served to a bearer METRICS_TOKEN, or without one to the
# networks in METRICS_ALLOW_IPS (loopback by default; empty: the token only). The gauges read from
# the database are read again at most every METRICS_CACHE_SECONDS.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOW_IPS = env.list("METRICS_ALLOW_IPS", default=["127.0.0.1/32", "::1/128"])
for _cidr in METRICS_ALLOW_IPS:
    try:
        ipaddress.ip_network(_cidr, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"METRICS_ALLOW_IPS: {_exc}") from None
METRICS_CACHE_SECONDS = env.float("METRICS_CACHE_SECONDS", default=15.0)
# Bulk operations (runtime/bulk.py): up to BULK_SYNC_LIMIT tasks run in the confirming request, more in
# the background worker in batches with progress; BULK_MAX_TASKS is one operation's ceiling. The preview
# counts what matches exactly within BULK_COUNT_BUDGET_MS, else says "counting…" and counts again
# within BULK_COUNT_FOLLOWUP_MS in a follow-up request.
BULK_SYNC_LIMIT = env.int("BULK_SYNC_LIMIT", default=200)
BULK_MAX_TASKS = env.int("BULK_MAX_TASKS", default=1_000_000)
BULK_COUNT_BUDGET_MS = env.int("BULK_COUNT_BUDGET_MS", default=250)
BULK_COUNT_FOLLOWUP_MS = env.int("BULK_COUNT_FOLLOWUP_MS", default=20_000)
# Alerts (runtime/alerts.py), beyond the stuck clauses above: a task quarantined, or with a cancel
# requested and not confirmed, for longer than these many seconds is raised as an alert too.
ALERT_QUARANTINE_AFTER = env.float("ALERT_QUARANTINE_AFTER", default=3600.0)
ALERT_CANCEL_AFTER = env.float("ALERT_CANCEL_AFTER", default=300.0)


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
    # kombu's filesystem transport, but a message appears in the folder only once it is whole
    # (config/broker.py): a half-written file used to crash the worker that read it.
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
elif CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    # Seconds a read or write on a broker connection may block (below).
    BROKER_SOCKET_TIMEOUT = env.float("BROKER_SOCKET_TIMEOUT", default=5.0)
    _broker_nodes = len([node for node in CELERY_BROKER_URL.split(";") if node.strip()])
    # RabbitMQ, the production broker (docs/operating/scale-out.md, "RabbitMQ"). Several nodes may be
    # listed, separated by ";": a worker or publisher whose node dies connects to the next one.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # A publish returns once the broker has the message (on a quorum queue: on a majority of
        # nodes), or raises; the doorbell logs that and the sweep rings again. Without confirms a
        # message sent to a node that dies the next moment is gone without a word.
        "confirm_publish": True,
        # py-amqp's socket reads and writes, and so the wait for a publish's confirm, block forever
        # by default: a node that hangs (SIGSTOP, a frozen VM) without closing its connections held a
        # worker blocked in a heartbeat event's confirm, taking no doorbell, for as long as it hung.
        # Past this many seconds the read or write fails like a lost connection: the worker moves to
        # the next node, a web process's doorbell fails and the sweep rings it (SO_RCVTIMEO and
        # SO_SNDTIMEO, set by amqp.transport; kombu passes these options to amqp.Connection).
        "read_timeout": BROKER_SOCKET_TIMEOUT,
        "write_timeout": BROKER_SOCKET_TIMEOUT,
        # A publisher's new connection tries each listed node once, in turn, before it gives up. kombu
        # bounds its connection attempts by one total time, by default the handshake timeout below:
        # the first node's timed-out handshake used it all, so while that node hung every doorbell
        # and sweep ring failed there without trying the next node.
        "max_retries": _broker_nodes - 1,
        "connect_retries_timeout": BROKER_SOCKET_TIMEOUT * _broker_nodes + 1,
    }
    # Connecting too: a hung node accepts the TCP connection (the kernel does) and never answers the
    # AMQP handshake, which py-amqp waits for this long.
    CELERY_BROKER_CONNECTION_TIMEOUT = BROKER_SOCKET_TIMEOUT
    # AMQP heartbeats on the worker's connections (its consumer and its event dispatcher; Celery sends
    # none on a web or beat process's connections, which drain nothing between publishes): a node that
    # stops answering is given up on after two missed intervals, instead of Celery's 120 s default's 240.
    CELERY_BROKER_HEARTBEAT = env.int("CELERY_BROKER_HEARTBEAT", default=10)
    # No remote control (celery inspect/control; nothing here sends any): its exclusive pidbox queue, left
    # on a hung node by the connection that declared it, could not be declared again on a surviving node
    # until the cluster counted the hung node as down, and the worker exited on that refusal.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
    # Quorum queues (Raft, replicated on every node of the cluster) for the region queues and the audit
    # queue: a node's death loses no message, and its queues' leaders move to the other nodes. The
    # default queue is this worker's region; the others (another region's doorbells, "audit") are
    # declared on first use, quorum too.
    CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"
    CELERY_TASK_CREATE_MISSING_QUEUE_TYPE = "quorum"
    # Quorum queues take no global QoS: the prefetch limit (CELERY_WORKER_PREFETCH_MULTIPLIER below)
    # applies per consumer instead, which is what one doorbell per pool process needs.
    CELERY_WORKER_DETECT_QUORUM_QUEUES = True
    # A countdown or eta on a quorum queue goes through RabbitMQ's native delayed delivery (the
    # celery_delayed_* exchanges and queues the worker declares, quorum too) instead of being held in
    # a worker's memory; that routing needs topic exchanges, not the default direct ones.
    CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"
    CELERY_TASK_CREATE_MISSING_QUEUE_EXCHANGE_TYPE = "topic"
    CELERY_BROKER_NATIVE_DELAYED_DELIVERY_QUEUE_TYPE = "quorum"
    # ...set up through the node the worker is connected to, not every node listed (config/broker.py):
    # Celery's own step retried a dead node for ~20 s after each reconnect, taking no message meanwhile.
    CELERY_WORKER_CONSUMER = "config.broker:Consumer"
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
# The anchor job signs with AUDIT_ANCHOR_KEY, which must not sit with the chain key in every web and
# region worker (whoever read both could sign a tombstone for a task deleted by hand, audit.tombstones):
# its own queue, consumed by one worker on the host that holds the key (docs/operating/workers.md).
AUDIT_QUEUE = "audit"
CELERY_TASK_ROUTES = {name: {"queue": AUDIT_QUEUE} for name in ("audit.anchor", "audit.anchor_if_due")}
# One message per pool process at a time: doorbells a worker cannot start yet stay in the broker,
# where any worker of the region can take them, instead of waiting behind a busy (or dying) one.
# Doorbells ack late and go back to the queue when their pool process dies (runtime/workers.py).
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "tasks.sweep", "schedule": env.float("SWEEP_INTERVAL", default=5.0)},
    "expire-approvals": {"task": "approvals.expire_pending", "schedule": 30.0},
    "reconcile": {
        "task": "ledger.reconcile_unknown",
        "schedule": env.float("RECONCILE_INTERVAL", default=10.0),
    },
    # Signed chain heads written outside the database (audit.anchor; docs/operating/tamper-evidence.md).
    # Polled every minute: writes one when AUDIT_ANCHOR_INTERVAL has passed or a doorbell rang.
    "audit-anchor": {"task": "audit.anchor_if_due", "schedule": 60.0},
    # Raise and clear alerts for tasks with no valid next event coming (runtime/alerts.py).
    "alerts-scan": {
        "task": "runtime.alerts_scan",
        "schedule": env.float("ALERT_SCAN_INTERVAL", default=30.0),
    },
    # Recount the tasks per tenant and state (runtime/rollups.py): the queue's chips, "as of" the count.
    "rollups": {"task": "runtime.rollups_refresh", "schedule": env.float("ROLLUP_INTERVAL", default=30.0)},
    # Archive and delete ended tasks by their tenants' policies (protection/retention.py), daily.
    "retention": {"task": "tasks.retention", "schedule": env.float("RETENTION_INTERVAL", default=86400.0)},
    # Send the A2A push notifications that are due (interop/push.py; run_worker --sweep does it too).
    "a2a-push": {"task": "interop.push_deliver", "schedule": env.float("A2A_PUSH_INTERVAL", default=2.0)},
}
CELERY_BEAT_SCHEDULE_FILENAME = env.str(
    "CELERY_BEAT_SCHEDULE_FILENAME", default=str(VAR_DIR / "celerybeat-schedule")
)
# A2A push notifications (interop/push.py, interop/ssrf.py). Hosts a push URL may name although they
# resolve to a non-global address (loopback, private, link-local…): exact names or literal addresses.
# Empty by default: only global unicast destinations are sent to.
A2A_PUSH_ALLOWED_HOSTS = env.list("A2A_PUSH_ALLOWED_HOSTS", default=[])
# Attempts of one delivery before it is marked failed (and the receiver's alert raised).
A2A_PUSH_MAX_ATTEMPTS = env.int("A2A_PUSH_MAX_ATTEMPTS", default=8)
# Backoff between attempts: base * 2**(attempt-1), capped, with up to 50 % random jitter (seconds).
A2A_PUSH_BACKOFF_BASE = env.float("A2A_PUSH_BACKOFF_BASE", default=1.0)
A2A_PUSH_BACKOFF_CAP = env.float("A2A_PUSH_BACKOFF_CAP", default=300.0)
# Timeout of one POST to a receiver (seconds; connect and read).
A2A_PUSH_TIMEOUT = env.float("A2A_PUSH_TIMEOUT", default=5.0)
# Seconds between two sending rounds (beat's "a2a-push" above, and run_worker --sweep's sender).
A2A_PUSH_INTERVAL = CELERY_BEAT_SCHEDULE["a2a-push"]["schedule"]
LEASE_TTL_SECONDS = env.float("LEASE_TTL_SECONDS", default=30.0)
# Tasks one run_worker process keeps in flight (threads; see runtime/loop.py), and the database
# connections they share: a slot holds one only while it talks to the database, not while it
# waits on a model or an outside system.
WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=32)
WORKER_DB_CONNECTIONS = env.int("WORKER_DB_CONNECTIONS", default=0)  # 0: min(concurrency, 8) + 2
# Each worker process holds a PostgreSQL advisory lock while it lives, so the leases of a process
# that died are taken over at once instead of after their TTL (tasks/liveness.py). Behind a
# transaction-pooling proxy the lock needs DATABASE_LIVENESS_URL (a direct connection), or this off.
WORKER_LIVENESS = env.bool("WORKER_LIVENESS", default=True)
dsn.require_direct_liveness(DATABASE_POOLER, WORKER_LIVENESS, DATABASE_LIVENESS)
# Leases are timed by the database's clock; a worker measures its own clock against it at start and
# on every heartbeat, and claims nothing while the two differ by more than this many seconds (the
# other times it writes, deadlines and audit times among them, come from its own clock).
WORKER_MAX_CLOCK_SKEW = env.float("WORKER_MAX_CLOCK_SKEW", default=5.0)

# The model behind "model turn" steps: the deterministic scripted model, or any
# OpenAI-compatible chat endpoint.
MODEL_BACKEND = env.str("MODEL_BACKEND", default="scripted")  # scripted | openai
MODEL_URL = env.str("MODEL_URL", default="")
MODEL_NAME = env.str("MODEL_NAME", default="")
MODEL_API_KEY = env.str("MODEL_API_KEY", default="")
MODEL_TIMEOUT = env.float("MODEL_TIMEOUT", default=30.0)
# The scripted model waits this long before answering, as a real model turn would (benchmarks, soak).
MODEL_LATENCY_MS = env.float("MODEL_LATENCY_MS", default=0.0)


def _model_prices(text: str) -> dict[str, tuple[Decimal, Decimal]]:
    """``"<model id>=<input>:<output>,..."`` (prices per 1M tokens) as {model id: (input, output)}.

    The model id is the one a turn records (``scripted-v1``, ``openai-compatible:<model>`` as the
    endpoint named it); it may hold ``:`` itself, so the prices are what follows its last ``=``.
    """
    prices: dict[str, tuple[Decimal, Decimal]] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        model, _, pair = entry.rpartition("=")
        parts = pair.split(":")
        try:
            given = tuple(Decimal(part.strip()) for part in parts)
        except ArithmeticError:
            given = ()
        if not model.strip() or len(given) != 2 or not all(p.is_finite() and p >= 0 for p in given):
            raise ImproperlyConfigured(
                f"MODEL_PRICES: {entry!r} is not <model id>=<input price>:<output price> (per 1M tokens)"
            )
        prices[model.strip()] = (given[0], given[1])
    return prices


# What each model's tokens cost, per 1M tokens (input, output), in one currency of your choice: each
# turn's cost is recorded from it (runtime.usage). A model missing here records its tokens, cost NULL.
# The default prices the two scripted models (fictitious, so the demo shows figures), nothing else.
MODEL_PRICES = _model_prices(
    env.str("MODEL_PRICES", default="scripted-v1=0.50:1.50,scripted-support-v1=0.50:1.50")
)
# The largest SDK run state an agent run may store at a pause (runtime.sdk.snapshots), in bytes: a
# bigger one is refused (the task is quarantined with the reason), never truncated.
AGENT_SNAPSHOT_MAX_BYTES = env.int("AGENT_SNAPSHOT_MAX_BYTES", default=512 * 1024)

# HTTPS and the browser's protections (docs/operating/production.md): `manage.py check --deploy` is clean with
# DEBUG off, a random SECRET_KEY of 50+ characters and ALLOWED_HOSTS set.
# X-Forwarded-Proto is whatever the client wrote unless a proxy in front replaces it: trusted only when
# the deployment says it has such a proxy. Behind a TLS-terminating proxy without it, the SSL redirect
# below would loop.
if env.bool("TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if not DEBUG:
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)

# Console sessions end after SESSION_IDLE_TIMEOUT seconds without a request of the person's own (the
# live refresh's polls do not count) and SESSION_ABSOLUTE_TIMEOUT after sign-in whatever happens
# (config.middleware.SessionTimeoutMiddleware). The cookie lives no longer than the absolute limit.
SESSION_IDLE_TIMEOUT = env.int("SESSION_IDLE_TIMEOUT", default=30 * 60)
SESSION_ABSOLUTE_TIMEOUT = env.int("SESSION_ABSOLUTE_TIMEOUT", default=12 * 3600)
SESSION_COOKIE_AGE = SESSION_ABSOLUTE_TIMEOUT

# Content-Security-Policy (django-csp 4): our own scripts, styles and images only, no inline script or
# style, no framing, forms post only here. Pages put behaviour in static/console/*.js, never inline.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    },
}

LOG_FORMAT = env.str("LOG_FORMAT", default="console")  # json | console (key=value lines for people)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Every line is redacted (URL credentials, tokens, secrets, sensitive fields) before it is written.
    "filters": {"redact": {"()": "audit.redaction.RedactingFilter"}},
    # structlog renders every line, the project's and the libraries', with its extra= fields and the
    # task/trace context (config/logging.py): JSON lines with LOG_FORMAT=json, key=value text otherwise.
    "formatters": {"structured": {"()": "config.logging.formatter", "log_format": LOG_FORMAT}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "filters": ["redact"], "formatter": "structured"}
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}
# A Celery worker keeps the handler above instead of installing its own: its lines are structured too.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# The task page links to its traces when set, e.g. https://tempo.example/trace/{trace_id} (config/otel.py).
TRACE_URL_TEMPLATE = env.str("TRACE_URL_TEMPLATE", default="")

# A2A v1.0 (a2a_api/, interop/). The absolute base URL callers reach this deployment at: the agent card
# names f"{PUBLIC_BASE_URL}/a2a/" as the endpoint (A2A clients post to exactly that URL).
PUBLIC_BASE_URL = env.str("PUBLIC_BASE_URL", default="http://127.0.0.1:8000").rstrip("/")
# The largest JSON-RPC request body POST /a2a/ reads; a larger one is an invalid-request error, unread.
A2A_MAX_MESSAGE_BYTES = env.int("A2A_MAX_MESSAGE_BYTES", default=256 * 1024)
# The task type a message with only a text part starts (the text is its objective); "" refuses such
# messages with invalid params (a data part must name the type).
A2A_DEFAULT_TASK_TYPE = env.str("A2A_DEFAULT_TASK_TYPE", default="")
# Streams (SendStreamingMessage, SubscribeToTask): how often a stream reads the transition log for new
# events, and how long one connection lasts before the server ends it (the client resumes it with
# Last-Event-ID = the last state_version it got). A stream holds no database connection between polls
# (each poll opens and closes one); it holds one web thread (gunicorn gthread) for its whole length, so
# a process serves at most A2A_STREAM_MAX_OPEN at once (keep it below WEB_THREADS).
A2A_STREAM_POLL_SECONDS = env.float("A2A_STREAM_POLL_SECONDS", default=0.5)
A2A_STREAM_MAX_SECONDS = env.float("A2A_STREAM_MAX_SECONDS", default=300.0)
A2A_STREAM_MAX_OPEN = env.int("A2A_STREAM_MAX_OPEN", default=4)
# The name the agent card gives this deployment.
A2A_AGENT_NAME = env.str("A2A_AGENT_NAME", default="Durable agent execution")
