"""Safe by default (issue 12, item 1): what a process gets with no environment, and the production profile.

Reproduced before: with no environment DEBUG was on, the secret key was the public
``dev-only-insecure-key``, cookies went without ``Secure``, the sandbox was open; with ``DEBUG=0``
every page was a 500 until ``collectstatic`` ran; ``X-Forwarded-Proto`` was trusted from anyone;
sessions lasted two weeks; ``/api/schema/`` answered anonymous callers; no CSP.

Settings are read once per process, so the profiles are checked in real processes started with
exactly the environment a deployment would give them (``production_env``), not the test run's.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from playwright.sync_api import Page, expect

from config.middleware import ACTIVE_AT, SIGNED_IN_AT
from tenancy.models import Role, Tenant
from tenancy.services import grant_role
from tests.conftest import api_client_for, make_task
from tests.workflow import ROOT, database_url

TEMPLATES = ROOT / "templates"


def bare_env(**values: str) -> dict[str, str]:
    """What any process has whatever the deployment: a PATH and a HOME, nothing of the test run's."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        **values,
    }


def production_env(**overrides: str) -> dict[str, str]:
    """The production profile: DEBUG unset (off), fresh random secrets, a real host name (README)."""
    env = bare_env(
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="console.example.com",
        FIELD_ENCRYPTION_KEYS=f"k1:{Fernet.generate_key().decode()}",
        AUDIT_HMAC_KEYS=f"k1:{secrets.token_urlsafe(32)}",
        AUDIT_ANCHOR_KEY=base64.b64encode(secrets.token_bytes(32)).decode(),
        SANDBOX_TOKEN=secrets.token_urlsafe(32),  # used only where a test turns the sandbox on
    )
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    return {**env, **overrides}


def manage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


SHOW_SETTINGS = (
    "import json; from django.conf import settings as s; print(json.dumps({name: getattr(s, name, None) "
    "for name in ['DEBUG', 'SECRET_KEY', 'SANDBOX_ENABLED', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
    "'SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER', 'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_AGE', "
    "'SESSION_IDLE_TIMEOUT', 'SESSION_ABSOLUTE_TIMEOUT']}))"
)


def settings_of(env: dict[str, str]) -> dict:
    result = manage(["shell", "-c", SHOW_SETTINGS], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- start-up ----------------------------------------------------------------------------------------


def test_a_process_started_without_any_environment_refuses_to_start():
    for command in (
        [sys.executable, "manage.py", "check"],
        [sys.executable, "-c", "import config.wsgi"],  # what gunicorn loads
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-P", "solo"],
    ):
        result = subprocess.run(command, cwd=ROOT, env=bare_env(), capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert "ImproperlyConfigured: SECRET_KEY is not set" in result.stderr
        assert "DEBUG=1" in result.stderr  # and says how to ask for a development run


def test_the_development_key_is_allowed_only_when_debug_is_asked_for():
    assert settings_of(bare_env(DEBUG="1"))["SECRET_KEY"] == "dev-only-insecure-key"
    refused = manage(["check"], bare_env(DEBUG="0"))
    assert refused.returncode != 0 and "SECRET_KEY is not set" in refused.stderr


def test_with_only_production_secrets_set_everything_is_closed():
    shown = settings_of(production_env())
    assert shown["DEBUG"] is False
    assert shown["SANDBOX_ENABLED"] is False
    assert shown["SESSION_COOKIE_SECURE"] is True and shown["CSRF_COOKIE_SECURE"] is True
    assert shown["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert shown["SECURE_SSL_REDIRECT"] is True
    assert shown["SECURE_PROXY_SSL_HEADER"] is None  # X-Forwarded-Proto is the client's to forge
    assert shown["SESSION_IDLE_TIMEOUT"] == 30 * 60
    assert shown["SESSION_COOKIE_AGE"] == shown["SESSION_ABSOLUTE_TIMEOUT"] == 12 * 3600


def test_the_forwarded_scheme_is_trusted_only_when_the_deployment_says_a_proxy_sets_it():
    shown = settings_of(production_env(TRUST_X_FORWARDED_PROTO="1"))
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_check_deploy_is_clean_under_the_production_profile():
    result = manage(["check", "--deploy", "--fail-level", "WARNING"], production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr


# --- a production server, DEBUG off, no collectstatic ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cookies(response: httpx.Response) -> dict[str, str]:
    """Set-Cookie headers by cookie name (httpx would not send Secure cookies back over plain HTTP)."""
    return {header.split("=", 1)[0]: header for header in response.headers.get_list("set-cookie")}


def _value(set_cookie: str) -> str:
    return set_cookie.split(";", 1)[0].split("=", 1)[1]


@pytest.fixture
def production_server(transactional_db, tmp_path):
    """gunicorn serving config.wsgi with the production profile behind a (declared) TLS proxy."""
    port = _free_port()
    env = production_env(
        DATABASE_URL=database_url(), ALLOWED_HOSTS="127.0.0.1", TRUST_X_FORWARDED_PROTO="1", LOG_LEVEL="ERROR"
    )
    log = (tmp_path / "gunicorn.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
            try:
                httpx.get(f"{base}/accounts/login/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gunicorn did not answer within 60 s"
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def test_a_production_server_serves_pages_and_static_files_without_collectstatic(production_server, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]  # what the server reads
    user = get_user_model().objects.create_user(username="prod-operator", password="a long pass phrase")
    grant_role(user, Tenant.objects.create(slug="acme", name="Acme"), Role.OPERATOR)
    https = {"X-Forwarded-Proto": "https"}
    http = httpx.Client(base_url=production_server, headers=https, timeout=20)

    login_page = http.get("/accounts/login/")
    assert login_page.status_code == 200  # a 500 before: the manifest storage wanted collectstatic
    assert 'href="/static/console/console.css"' in login_page.text
    assert login_page.headers["strict-transport-security"].startswith("max-age=31536000")
    assert "frame-ancestors 'none'" in login_page.headers["content-security-policy"]
    csrf = _cookies(login_page)["csrftoken"]
    assert "Secure" in csrf

    for path, source in [
        ("/static/console/console.css", ROOT / "static/console/console.css"),
        ("/static/console/live.js", ROOT / "static/console/live.js"),
    ]:
        served = http.get(path)
        assert served.status_code == 200 and served.content == Path(source).read_bytes()
    assert http.get("/static/django_htmx/htmx-2.min.js").status_code == 200  # an app's own static file

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
    logged_in = http.post(
        "/accounts/login/",
        data={"username": "prod-operator", "password": "a long pass phrase", "csrfmiddlewaretoken": token},
        # As a browser over HTTPS sends it: CSRF checks the referer of a secure request.
        headers={
            "Cookie": f"csrftoken={_value(csrf)}",
            "Referer": f"https://{login_page.url.netloc.decode()}/",
        },
    )
    assert logged_in.status_code == 302, logged_in.text[:500]
    session = _cookies(logged_in)["sessionid"]
    assert "Secure" in session and "HttpOnly" in session
    assert "no-store" in logged_in.headers["cache-control"]

    queue = http.get("/console/", headers={"Cookie": f"sessionid={_value(session)}"})
    assert queue.status_code == 200
    assert "no-store" in queue.headers["cache-control"]
    assert "default-src 'self'" in queue.headers["content-security-policy"]

    # Without the proxy's header the request is plain HTTP, and is sent to HTTPS.
    plain = httpx.get(f"{production_server}/accounts/login/", headers={"X-Forwarded-Proto": "http"})
    assert plain.status_code == 301 and plain.headers["location"].startswith("https://")


def test_health_probes_addressed_by_ip_are_answered_under_the_real_server_with_tracing_on(production_server):
    """A Kubernetes probe sends ``Host: <pod ip>:<port>``, which ALLOWED_HOSTS rightly refuses. The probes
    are answered before host validation — also when OpenTelemetry's middleware is installed (it builds the
    request's absolute URL: placed first, it answered 400 to every probe)."""
    by_ip = {"Host": "10.244.3.17:8000"}
    live = httpx.get(f"{production_server}/healthz", headers=by_ip, timeout=10)
    assert live.status_code == 200, live.text[:300]
    assert live.json()["status"] == "ok"
    ready = httpx.get(f"{production_server}/readyz", headers=by_ip, timeout=10)
    assert ready.status_code in (200, 503), ready.text[:300]  # 503 names the dependency that is down
    assert "database" in ready.json()["checks"]
    # Everything else still refuses a host it does not serve.
    assert httpx.get(f"{production_server}/accounts/login/", headers=by_ip, timeout=10).status_code == 400


# --- headers on every answer ------------------------------------------------------------------------


def policy(response) -> dict[str, str]:
    directives = (part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    return {d[0]: (d[1] if len(d) > 1 else "") for d in directives if d[0]}


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_script(client, operator):
    anonymous = policy(client.get("/accounts/login/"))
    client.force_login(operator)
    console = policy(client.get("/console/"))
    assert anonymous == console
    assert console["default-src"] == "'self'"
    assert console["script-src"] == "'self'" and console["style-src"] == "'self'"
    assert console["frame-ancestors"] == "'none'" and console["form-action"] == "'self'"
    assert "unsafe" not in str(console)


def test_templates_hold_no_inline_script_handler_or_style():
    """What the policy would block: behaviour and styles live in static/ (CSP: script-src 'self')."""
    inline_script = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
    handler = re.compile(r"\son[a-z]+\s*=", re.I)
    style = re.compile(r"<style\b|\sstyle\s*=", re.I)
    offenders = [
        f"{path.relative_to(ROOT)}: {kind}"
        for path in TEMPLATES.rglob("*.html")
        for kind, pattern in (("inline script", inline_script), ("on* handler", handler), ("style", style))
        if pattern.search(path.read_text())
    ]
    assert offenders == []


@pytest.mark.django_db
def test_answers_to_a_signed_in_user_are_never_stored(client, operator, acme):
    anonymous = client.get("/console/")
    assert anonymous.status_code == 302 and "no-store" not in anonymous.get("Cache-Control", "")
    client.force_login(operator)
    task = make_task(acme)
    for path in ("/console/", f"/console/tasks/{task.id}/", "/console/approvals/"):
        assert "no-store" in client.get(path)["Cache-Control"], path
    api = api_client_for(operator).get("/api/tasks/")  # authenticated by DRF, not the session
    assert api.status_code == 200 and "no-store" in api["Cache-Control"]
    static = client.get("/static/console/console.css")
    assert "no-store" not in static.get("Cache-Control", "")  # WhiteNoise answers first: cacheable


@pytest.mark.django_db
def test_the_schema_needs_a_signed_in_caller(client, operator):
    assert client.get("/api/schema/", {"format": "json"}).status_code in (401, 403)
    client.force_login(operator)
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]


# --- session limits ---------------------------------------------------------------------------------


def signed_in(client: Client, user, *, signed_in_ago: float, active_ago: float) -> None:
    client.force_login(user)
    session = client.session
    now = time.time()
    session[SIGNED_IN_AT], session[ACTIVE_AT] = now - signed_in_ago, now - active_ago
    session.save()


@pytest.mark.django_db
def test_a_session_idle_too_long_is_signed_out(client, operator):
    signed_in(client, operator, signed_in_ago=3600, active_ago=settings.SESSION_IDLE_TIMEOUT + 5)
    response = client.get("/console/")
    assert response.status_code == 302 and response["Location"].startswith(settings.LOGIN_URL)
    assert client.get("/console/").status_code == 302  # for good, not just once


@pytest.mark.django_db
def test_a_session_older_than_the_absolute_limit_is_signed_out_however_active(client, operator):
    signed_in(client, operator, signed_in_ago=settings.SESSION_ABSOLUTE_TIMEOUT + 5, active_ago=1)
    assert client.get("/console/").status_code == 302


@pytest.mark.django_db
def test_a_request_of_the_persons_own_keeps_the_session_but_a_live_poll_does_not(client, operator):
    signed_in(client, operator, signed_in_ago=3600, active_ago=600)
    before = client.session[ACTIVE_AT]
    assert client.get("/console/", HTTP_HX_REQUEST="true").status_code == 200
    assert client.session[ACTIVE_AT] == before  # a poll is not activity
    assert client.get("/console/").status_code == 200
    assert client.session[ACTIVE_AT] > before + 500


@pytest.mark.django_db
def test_an_expired_live_poll_reloads_the_page_instead_of_swapping_in_the_login_form(client, operator):
    signed_in(client, operator, signed_in_ago=3600, active_ago=settings.SESSION_IDLE_TIMEOUT + 5)
    response = client.get("/console/", HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Refresh"] == "true"


@pytest.mark.django_db
def test_a_session_signed_in_before_the_limits_existed_is_limited_from_now_on(client, operator):
    client.force_login(operator)
    session = client.session
    del session[SIGNED_IN_AT], session[ACTIVE_AT]
    session.save()
    assert client.get("/console/").status_code == 200
    assert abs(client.session[SIGNED_IN_AT] - time.time()) < 60


@pytest.mark.django_db
def test_signing_in_starts_both_clocks(client, settings):
    settings.AXES_ENABLED = False
    get_user_model().objects.create_user(username="fresh", password="pw")
    client.post("/accounts/login/", {"username": "fresh", "password": "pw"})
    assert abs(client.session[SIGNED_IN_AT] - time.time()) < 60
    assert client.session[ACTIVE_AT] == client.session[SIGNED_IN_AT]


# --- the console under the policy, in a browser -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_console_runs_under_the_policy_without_a_violation(page: Page, live_server, acme, operator):
    from tests.console.test_browser import log_in

    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    task = make_task(acme, objective="Under the policy")
    log_in(page, live_server.url, "acme-operator")
    expect(page.locator("[data-live]")).to_be_visible()  # live.js ran: the indicator is shown by script
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    expect(page.locator("[data-live]")).to_be_visible()
    page.wait_for_timeout(5_500)  # one live refresh (htmx) under the policy
    assert violations == []
