"""Accounts and tokens (issue 12): login lockout, API throttles, scoped hashed tokens, the
integrator role, role changes in the admin, and the access log auditors read."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from tasks.models import Task
from tenancy.models import AccessEvent, ApiToken, Membership, Role
from tenancy.services import grant_role, revoke_role, token_create, token_revoke
from tests.api.conftest import control_body, create_body, post_json, url, waiting_for_input
from tests.conftest import make_task, make_user

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
Kind = AccessEvent.Kind


def login(client: Client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def token_client(key: str, keyword: str = "Token") -> Client:
    return Client(HTTP_AUTHORIZATION=f"{keyword} {key}")


def new_token(user, *scopes: str, **fields) -> str:
    fields.setdefault("expires_at", timezone.now() + timedelta(days=1))
    return token_create(user, scopes=scopes or ["read"], **fields)[1]


def kinds(**filters) -> list[str]:
    return list(AccessEvent.objects.filter(**filters).order_by("id").values_list("kind", flat=True))


# --- login throttling and lockout ------------------------------------------------------------------


def test_fifty_wrong_passwords_lock_the_account_even_against_the_right_one(operator):
    client = Client()
    for _ in range(50):
        login(client, "acme-operator", "guess")
    response = login(client, "acme-operator", "pw")
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert not signed_in(client)


def test_the_lockout_is_a_page_not_an_error_and_says_why(operator):
    client = Client()
    for _ in range(5):
        response = login(client, "acme-operator", "guess")
    assert response.status_code == 429
    assert response["Content-Type"].startswith("text/html")
    assert b"acme-operator" in response.content


def test_four_wrong_passwords_do_not_lock_and_a_success_clears_the_count(operator):
    client = Client()
    for _ in range(4):
        login(client, "acme-operator", "guess")
    assert login(client, "acme-operator", "pw").status_code == 302 and signed_in(client)
    client.post("/accounts/logout/")
    for _ in range(4):  # counted from zero again: four more are not five
        login(client, "acme-operator", "guess")
    login(client, "acme-operator", "pw")
    assert signed_in(client)


def test_the_lockout_is_per_username_and_address_and_ends_after_the_cool_off(operator):
    for _ in range(5):
        login(Client(), "acme-operator", "guess", address="10.0.0.1")
    elsewhere = Client()
    login(elsewhere, "acme-operator", "pw", address="10.0.0.2")
    assert signed_in(elsewhere)  # another address is not locked out by this one's failures

    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    later = Client()
    login(later, "acme-operator", "pw", address="10.0.0.1")
    assert signed_in(later)


def test_a_forged_forwarded_for_header_does_not_escape_the_lockout(operator):
    client = Client()
    for _ in range(5):
        login(client, "acme-operator", "guess", address="10.0.0.1")
    response = client.post(
        LOGIN,
        {"username": "acme-operator", "password": "pw"},
        REMOTE_ADDR="10.0.0.1",
        HTTP_X_FORWARDED_FOR="203.0.113.9",
    )
    assert response.status_code == 429 and not signed_in(client)


# --- API throttles ---------------------------------------------------------------------------------


@pytest.fixture
def low_rates(monkeypatch):
    # DRF binds the rates to its throttle classes when they are imported, so the settings fixture
    # alone would not reach them.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "3/min", "anon": "3/min"})


def test_an_api_user_past_the_rate_gets_429_with_retry_after(low_rates, operator):
    client = token_client(new_token(operator, "read"))
    answers = [client.get("/api/tasks/").status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    response = client.get("/api/tasks/")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0


def test_the_user_rate_is_per_user(low_rates, operator, auditor):
    busy = token_client(new_token(operator, "read"))
    for _ in range(3):
        busy.get("/api/tasks/")
    assert busy.get("/api/tasks/").status_code == 429
    assert token_client(new_token(auditor, "read")).get("/api/tasks/").status_code == 200


def test_wrong_tokens_are_throttled_per_address_even_before_a_right_one(low_rates, operator):
    key = new_token(operator, "read")
    for _ in range(3):
        assert token_client("not-a-key").get("/api/tasks/", REMOTE_ADDR="10.0.0.7").status_code == 401
    # Past the rate a right key is refused too, so guessing cannot be confirmed at speed.
    response = token_client(key).get("/api/tasks/", REMOTE_ADDR="10.0.0.7")
    assert response.status_code == 429 and "Retry-After" in response
    assert token_client(key).get("/api/tasks/", REMOTE_ADDR="10.0.0.8").status_code == 200


# --- tokens: hashed, scoped, expiring, revocable ---------------------------------------------------


def test_the_database_holds_only_the_digest_of_a_token(operator):
    token, key = token_create(operator, scopes=["read"], expires_at=None, name="ci")
    stored = ApiToken.objects.filter(pk=token.pk).values().get()
    assert key not in json.dumps(stored, default=str)
    assert stored["key_digest"] == hashlib.sha256(key.encode()).hexdigest()
    assert stored["prefix"] == key[:8]
    assert token_client(key).get("/api/tasks/").status_code == 200


def test_token_and_bearer_headers_both_authenticate(operator):
    key = new_token(operator, "read")
    assert token_client(key, "Token").get("/api/tasks/").status_code == 200
    assert token_client(key, "Bearer").get("/api/tasks/").status_code == 200


def test_an_expired_token_answers_401(operator):
    key = new_token(operator, "read")
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = token_client(key).get("/api/tasks/")
    assert response.status_code == 401 and response.json()["detail"] == "Token expired."
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_token_answers_401(operator):
    token, key = token_create(operator, scopes=["read"], expires_at=None)
    assert token_revoke(token) is True
    assert token_revoke(token) is False  # once
    response = token_client(key).get("/api/tasks/")
    assert response.status_code == 401 and response.json()["detail"] == "Token revoked."


def test_a_token_of_a_deactivated_user_answers_401(operator):
    key = new_token(operator, "read")
    get_user_model().objects.filter(pk=operator.pk).update(is_active=False)
    assert token_client(key).get("/api/tasks/").status_code == 401


def test_last_used_is_written_at_most_once_a_minute(operator):
    token, key = token_create(operator, scopes=["read"], expires_at=None)
    client = token_client(key)
    client.get("/api/tasks/")
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    client.get("/api/tasks/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.update(last_used_at=first - timedelta(minutes=2))
    client.get("/api/tasks/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


def test_a_token_can_do_only_what_its_scopes_and_its_users_roles_allow(acme, operator):
    task = make_task(acme)
    reader = token_client(new_token(operator, "read"))
    assert reader.get(url(task)).status_code == 200
    assert post_json(reader, url(task, "cancel"), control_body(1)).status_code == 403
    operate = token_client(new_token(operator, "operate"))
    assert operate.get(url(task)).status_code == 403  # read is a scope of its own
    assert post_json(operate, url(task, "cancel"), control_body(1)).status_code == 200
    approve = token_client(new_token(operator, "approve", "integrate", "read", "operate"))
    assert approve.get("/api/approvals/").status_code == 200  # an operator's token decides nothing anyway


def test_drf_create_token_prints_the_key_once_and_revoke_token_ends_it(operator):
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "drf_create_token",
        "acme-operator",
        "--scopes",
        "read,integrate",
        "--expires-days",
        "30",
        "--name",
        "erp",
        stdout=out,
        stderr=err,
    )
    words = out.getvalue().split()
    assert words[:2] == ["Generated", "token"] and words[3:] == ["for", "user", "acme-operator"]
    key = words[2]
    token = ApiToken.objects.get()
    assert (token.name, token.scopes, token.prefix) == ("erp", "read integrate", key[:8])
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    assert key not in err.getvalue()
    assert token_client(key).get("/api/tasks/").status_code == 200

    call_command("revoke_token", token.prefix, stdout=io.StringIO())
    assert token_client(key).get("/api/tasks/").status_code == 401


def test_a_key_never_starts_with_a_dash_so_its_prefix_is_never_read_as_an_option(operator, monkeypatch):
    draws = iter(["-starts-like-an-option", "Plain-key-after"])
    monkeypatch.setattr("tenancy.services.secrets.token_urlsafe", lambda n: next(draws))
    token, key = token_create(operator, scopes=["read"], expires_at=None)
    assert key == "Plain-key-after" and token.prefix == key[: ApiToken.PREFIX_LENGTH]
    call_command("revoke_token", token.prefix, stdout=io.StringIO())
    assert token_client(key).get("/api/tasks/").status_code == 401


def test_drf_create_token_refuses_an_unknown_scope(operator):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown scope everything"):
        call_command("drf_create_token", "acme-operator", "--scopes", "read,everything")
    assert not ApiToken.objects.exists()


def test_the_admin_lists_tokens_without_keys_and_revokes_them(operator):
    token, key = token_create(operator, scopes=["read"], expires_at=None, name="ci")
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    listing = staff.get("/admin/tenancy/apitoken/")
    assert listing.status_code == 200
    assert token.prefix.encode() in listing.content
    assert key.encode() not in listing.content and token.key_digest.encode() not in listing.content
    page = staff.get(f"/admin/tenancy/apitoken/{token.pk}/change/")
    assert token.key_digest.encode() not in page.content
    staff.post("/admin/tenancy/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert token_client(key).get("/api/tasks/").status_code == 401


# --- the integrator role ---------------------------------------------------------------------------


def test_an_integrator_starts_and_feeds_tasks_but_runs_no_controls(acme, integrator):
    client = token_client(new_token(integrator, "read", "integrate", "operate"))
    started = post_json(client, "/api/tasks/", create_body())
    assert started.status_code == 201
    assert started.json()["allowed_transitions"] == []  # nothing an integrator may pull from "ready"
    task = waiting_for_input(Task.objects.get(pk=started.json()["id"]))
    assert [m["trigger"] for m in client.get(url(task)).json()["allowed_transitions"]] == ["input_received"]
    body = {"expected_version": task.state_version, "payload": {"answer": "mug"}}
    assert post_json(client, url(task, "input"), body).status_code == 200
    assert post_json(client, url(task, "cancel"), control_body(task.state_version + 1)).status_code == 403
    assert client.get("/api/approvals/").status_code == 200


def test_a_task_an_integrator_started_resumes_while_it_keeps_the_role(acme, integrator):
    from tests.runtime.test_validation import resuming, verdict

    assert verdict(resuming(acme, owner=integrator)).reason_code != "owner_access_revoked"
    revoke_role(integrator, acme, Role.INTEGRATOR)
    assert verdict(resuming(acme, owner=integrator)).reason_code == "owner_access_revoked"


# --- role changes ----------------------------------------------------------------------------------


def test_changing_a_role_in_the_admin_replaces_it(acme, outsider, globex):
    membership = Membership.objects.get(user=outsider)
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    response = staff.post(
        f"/admin/tenancy/membership/{membership.pk}/change/",
        {"user": outsider.pk, "tenant": globex.pk, "role": Role.AUDITOR, "_save": "Save"},
    )
    assert response.status_code == 302
    assert list(Membership.objects.filter(user=outsider).values_list("role", flat=True)) == [Role.AUDITOR]
    assert sorted(outsider.groups.values_list("name", flat=True)) == ["globex:auditor"]
    task = make_task(globex)
    client = Client()
    client.force_login(outsider)
    assert post_json(client, url(task, "escalate"), control_body(1)).status_code == 403
    events = AccessEvent.objects.filter(tenant=globex, kind__in=[Kind.ROLE_REVOKED, Kind.ROLE_GRANTED])
    assert [(e.kind, e.detail, e.username) for e in events.order_by("id")][-2:] == [
        (Kind.ROLE_REVOKED, "role=operator user=globex-operator", "root"),
        (Kind.ROLE_GRANTED, "role=auditor user=globex-operator", "root"),
    ]


def test_deleting_memberships_in_bulk_in_the_admin_revokes_their_groups(outsider):
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    membership = Membership.objects.get(user=outsider)
    staff.post(
        "/admin/tenancy/membership/",
        {"action": "delete_selected", "_selected_action": [membership.pk], "post": "yes"},
    )
    assert not Membership.objects.filter(user=outsider).exists()
    assert not outsider.groups.exists()
    assert kinds(kind=Kind.ROLE_REVOKED) == [Kind.ROLE_REVOKED]


def test_grant_and_revoke_record_who_did_it_once(acme, admin_user):
    user = make_user("someone")
    grant_role(user, acme, Role.AUDITOR, by=admin_user)
    grant_role(user, acme, Role.AUDITOR, by=admin_user)  # already held: nothing new to record
    assert revoke_role(user, acme, Role.AUDITOR, by=admin_user) is True
    assert revoke_role(user, acme, Role.AUDITOR, by=admin_user) is False
    rows = AccessEvent.objects.filter(detail="role=auditor user=someone").order_by("id")
    assert [(e.kind, e.user_id, e.tenant_id) for e in rows] == [
        (Kind.ROLE_GRANTED, admin_user.pk, acme.pk),
        (Kind.ROLE_REVOKED, admin_user.pk, acme.pk),
    ]


# --- the access log --------------------------------------------------------------------------------


def test_logins_failures_lockouts_and_logouts_are_recorded(operator):
    client = Client()
    login(client, "acme-operator", "pw")
    client.post("/accounts/logout/")
    login(client, "nobody-by-that-name", "guess")
    for _ in range(5):
        login(client, "acme-operator", "guess")
    assert kinds(user=operator)[:2] == [Kind.LOGIN, Kind.LOGOUT]
    assert Kind.LOCKED_OUT in kinds(user=operator)
    typed = AccessEvent.objects.get(kind=Kind.LOGIN_FAILED, username="nobody-by-that-name")
    assert typed.user is None and typed.ip == "10.0.0.1" and typed.path == LOGIN
    assert AccessEvent.objects.filter(kind=Kind.LOGIN_FAILED, user=operator).count() >= 5


def test_refusals_are_recorded_from_the_api_and_the_console(acme, approver):
    task = make_task(acme)
    client = Client()
    client.force_login(approver)
    assert post_json(client, url(task, "cancel"), control_body(1)).status_code == 403
    assert client.get("/console/audit/").status_code == 403
    refused = AccessEvent.objects.filter(kind=Kind.FORBIDDEN, user=approver).order_by("id")
    assert [(e.path, e.detail.split()[0]) for e in refused] == [
        (url(task, "cancel"), "POST"),
        ("/console/audit/", "GET"),
    ]


def test_token_creation_and_revocation_are_recorded_under_the_owner(operator, admin_user):
    token, _ = token_create(operator, scopes=["read", "operate"], expires_at=None, name="erp")
    token_revoke(token, by=admin_user)
    rows = AccessEvent.objects.filter(user=operator, kind__in=[Kind.TOKEN_CREATED, Kind.TOKEN_REVOKED])
    described = f"token={token.prefix} name='erp' scopes=read,operate expires=never"
    assert [(e.kind, e.detail) for e in rows.order_by("id")] == [
        (Kind.TOKEN_CREATED, described),
        (Kind.TOKEN_REVOKED, f"{described} by=acme-admin"),
    ]


def test_auditors_read_their_tenants_access_log_and_nothing_of_others(
    acme, globex, operator, auditor, outsider
):
    Client().force_login(operator)  # a login of an acme member
    Client().force_login(outsider)  # and one of globex's
    grant_role(make_user("new-hire"), globex, Role.APPROVER)
    client = Client()
    client.force_login(auditor)
    seen = client.get("/api/access-events/", {"kind": "login"}).json()["results"]
    assert {e["username"] for e in seen} == {"acme-operator", "acme-auditor"}
    grants = client.get("/api/access-events/", {"kind": "role_granted"}).json()["results"]
    assert grants and all(e["tenant"] == "acme" for e in grants)
    page = client.get("/console/access/", {"user": "acme-operator"})
    assert page.status_code == 200
    assert b"acme-operator" in page.content and b"globex-operator" not in page.content
    assert b'href="/console/access/"' in page.content  # the navigation links it for auditors


def test_the_access_log_pages_by_keyset(acme, auditor, operator):
    for _ in range(60):
        Client().force_login(operator)
    client = Client()
    client.force_login(auditor)
    first = client.get("/console/access/", {"kind": "login"})
    before = first.context["page"].next_before
    assert len(first.context["page"].events) == 50 and before is not None
    second = client.get("/console/access/", {"kind": "login", "before": before}).context["page"]
    assert len(second.events) == 11 and second.next_before is None  # 60 + the auditor's own login
    api = client.get("/api/access-events/", {"kind": "login", "page_size": 50}).json()
    assert len(api["results"]) == 50 and api["next"]


def test_bad_access_log_filters_are_400(auditor):
    client = Client()
    client.force_login(auditor)
    assert client.get("/api/access-events/", {"kind": "everything"}).status_code == 400
    assert client.get("/console/access/", {"kind": "everything"}).status_code == 400
    assert client.get("/console/access/", {"before": "x"}).status_code == 400
    assert client.get("/api/access-events/", {"cursor": "garbage"}).status_code == 400


def test_operators_see_no_access_log_link_and_get_403(operator):
    client = Client()
    client.force_login(operator)
    assert b'href="/console/access/"' not in client.get("/console/").content
    assert client.get("/console/access/").status_code == 403
