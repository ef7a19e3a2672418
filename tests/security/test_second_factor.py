"""The second factor of approvers and admins (issue 20, item 7), through the real login pages:
the password alone opens nothing, enrollment, codes, recovery codes, the lockout, the access log,
and the password validators."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from approvals.models import ApprovalRequest, ApprovalStatus
from tenancy.models import AccessEvent, Role
from tenancy.services import grant_role, token_create
from tests.conftest import make_task, make_user
from tests.console.test_approvals import ask
from tests.second_factor import CODE_PAGE, ENROLL_PAGE, LOGIN, code_for, device_for, key_of, totp_code

pytestmark = pytest.mark.django_db

Kind = AccessEvent.Kind


def password(client: Client, username: str, address: str = "10.0.0.1"):
    """The password form, followed: where the person lands."""
    return client.post(LOGIN, {"username": username, "password": "pw"}, follow=True, REMOTE_ADDR=address)


def give_code(client: Client, code: str, address: str = "10.0.0.1"):
    return client.post(CODE_PAGE, {"code": code}, REMOTE_ADDR=address)


def landed(response) -> str:
    return response.request["PATH_INFO"]


def events(user, *kinds: str) -> list[tuple[str, str]]:
    rows = AccessEvent.objects.filter(user=user, kind__in=kinds).order_by("id")
    return list(rows.values_list("kind", "detail"))


def enroll(client: Client, user) -> list[str]:
    """Sign in for the first time: the password, then the enrollment page; the recovery codes shown."""
    assert landed(password(client, user.get_username())) == ENROLL_PAGE
    secret = re.search(r'id="totp-secret">([A-Z2-7 ]+)<', client.get(ENROLL_PAGE).content.decode())
    assert secret
    response = client.post(ENROLL_PAGE, {"code": totp_code(key_of(secret.group(1)))})
    assert response.status_code == 200
    return response.context["codes"]


@pytest.fixture
def admin_only(acme):
    return make_user("acme-admin-only", acme, Role.ADMIN)  # an admin who is no approver


@pytest.mark.parametrize("who", ["approver", "admin_only"])
def test_the_password_alone_of_an_approver_or_admin_lands_on_the_code_page_and_opens_nothing(
    request, who, acme
):
    user = request.getfixturevalue(who)
    device_for(user)
    client = Client()
    assert landed(password(client, user.get_username())) == CODE_PAGE
    for page in ("/console/", "/console/approvals/", "/console/access/", "/admin/"):
        response = client.get(page)
        assert response.status_code == 302 and response["Location"].startswith(CODE_PAGE), page
    assert client.get("/api/tasks/").status_code == 403


def test_an_approver_cannot_decide_before_the_code_and_can_after_it(acme, approver):
    approval = ask(make_task(acme))
    device = device_for(approver)
    client = Client()
    password(client, "acme-approver")
    decide = f"/console/approvals/{approval.id}/decide/"
    body = {"decision": "reject", "digest": approval.digest, "comment": "no", "confirmed": "True"}

    refused = client.post(decide, body)
    assert refused.status_code == 302 and refused["Location"] == CODE_PAGE
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING

    assert give_code(client, code_for(device)).status_code == 302
    client.post(decide, body)
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.REJECTED


@pytest.mark.parametrize(
    ("who", "lands_on"),
    [("operator", "/console/"), ("auditor", "/console/audit/"), ("integrator", "/console/")],
)
def test_an_operator_auditor_or_integrator_is_not_asked_for_a_code(request, who, lands_on):
    user = request.getfixturevalue(who)
    client = Client()
    assert landed(password(client, user.get_username())) == lands_on
    assert client.get("/console/").status_code == 200
    assert not TOTPDevice.objects.filter(user=user).exists()


def test_a_first_login_enrolls_and_a_later_login_takes_a_code_from_the_app(approver):
    client = Client()
    assert landed(password(client, "acme-approver")) == ENROLL_PAGE
    page = client.get(ENROLL_PAGE).content.decode()
    secret = re.search(r'id="totp-secret">([A-Z2-7 ]+)<', page).group(1)
    assert "otpauth://totp/Durable%20agents%3Aacme-approver?secret=" + "".join(secret.split()) in page
    assert "<svg" in page  # the QR code, inline
    assert client.get(ENROLL_PAGE).content.decode().count(secret) == 1  # a reload keeps the secret

    shown = client.post(ENROLL_PAGE, {"code": totp_code(key_of(secret))})
    assert shown.status_code == 200 and len(shown.context["codes"]) == 10
    assert all(code in shown.content.decode() for code in shown.context["codes"])
    assert client.get("/console/approvals/").status_code == 200
    assert events(approver, Kind.SECOND_FACTOR_ENROLLED) == [
        (Kind.SECOND_FACTOR_ENROLLED, "recovery_codes=10")
    ]

    client.post("/accounts/logout/")
    assert landed(password(client, "acme-approver")) == CODE_PAGE
    device = TOTPDevice.objects.get(user=approver, confirmed=True)
    response = client.post(CODE_PAGE, {"code": code_for(device), "next": "/console/approvals/"}, follow=True)
    assert landed(response) == "/console/approvals/" and response.status_code == 200
    assert events(approver, Kind.SECOND_FACTOR_PASSED) == [(Kind.SECOND_FACTOR_PASSED, "device=totp")]


def test_someone_with_only_the_password_cannot_enroll_a_new_device_over_the_existing_one(approver):
    device = device_for(approver)
    client = Client()
    password(client, "acme-approver")
    response = client.get(ENROLL_PAGE)
    assert response.status_code == 302 and response["Location"].startswith(CODE_PAGE)
    assert client.post(ENROLL_PAGE, {"code": "123456"}).status_code == 302
    assert list(TOTPDevice.objects.filter(user=approver)) == [device]


def test_a_wrong_code_is_refused_with_a_message_and_recorded(approver):
    device_for(approver)
    client = Client()
    password(client, "acme-approver")
    response = give_code(client, "000000")
    assert response.status_code == 400
    assert "That code is not right" in response.content.decode()
    assert client.get("/console/").status_code == 302  # still not through
    assert events(approver, Kind.SECOND_FACTOR_FAILED) == [(Kind.SECOND_FACTOR_FAILED, "device=totp")]
    assert not events(approver, Kind.SECOND_FACTOR_PASSED)


def test_a_code_signs_in_once_and_not_a_second_session(approver):
    device = device_for(approver)
    code = code_for(device)
    first, second = Client(), Client()
    password(first, "acme-approver")
    password(second, "acme-approver", address="10.0.0.2")
    assert give_code(first, code).status_code == 302
    assert give_code(second, code, address="10.0.0.2").status_code == 400
    assert second.get("/console/").status_code == 302


def test_a_recovery_code_works_once(approver, settings):
    settings.OTP_STATIC_THROTTLE_FACTOR = 0  # the second try comes at once; the wait is not the point
    client = Client()
    codes = enroll(client, approver)
    client.post("/accounts/logout/")

    password(client, "acme-approver")
    assert give_code(client, codes[0].upper()).status_code == 302  # typed in capitals: the same code
    assert client.get("/console/approvals/").status_code == 200
    client.post("/accounts/logout/")

    password(client, "acme-approver")
    assert give_code(client, codes[0]).status_code == 400
    assert client.get("/console/approvals/").status_code == 302
    assert events(approver, Kind.RECOVERY_CODE_USED, Kind.SECOND_FACTOR_FAILED) == [
        (Kind.RECOVERY_CODE_USED, "remaining=9"),
        (Kind.SECOND_FACTOR_FAILED, "device=recovery"),
    ]


def test_five_wrong_codes_lock_the_account_out_and_end_the_session(approver):
    device_for(approver)
    client = Client()
    password(client, "acme-approver")
    for _ in range(4):
        assert give_code(client, "000000").status_code == 400
    locked = give_code(client, "000000")
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert "_auth_user_id" not in client.session
    # The right password is refused too, for the cool-off, as after five wrong passwords.
    assert (
        client.post(
            LOGIN, {"username": "acme-approver", "password": "pw"}, REMOTE_ADDR="10.0.0.1"
        ).status_code
        == 429
    )
    assert AccessEvent.objects.filter(kind=Kind.LOCKED_OUT, user=approver).exists()
    assert AccessEvent.objects.filter(kind=Kind.SECOND_FACTOR_FAILED, user=approver).count() == 5


def test_wrong_codes_in_a_row_make_the_device_wait_even_across_new_logins(approver):
    device = device_for(approver)
    client = Client()
    password(client, "acme-approver")
    give_code(client, "000000")
    client.post("/accounts/logout/")
    password(client, "acme-approver")  # a new login does not reset the device's wait
    response = give_code(client, code_for(device))  # the right code, less than a second later
    assert response.status_code == 400 and "try again after" in response.content.decode()
    assert events(approver, Kind.SECOND_FACTOR_FAILED)[-1] == (
        Kind.SECOND_FACTOR_FAILED,
        "device=totp throttled",
    )


def test_the_code_page_sends_only_to_pages_of_this_site(approver):
    device = device_for(approver)
    client = Client()
    password(client, "acme-approver")
    response = client.post(CODE_PAGE, {"code": code_for(device), "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == "/console/start/"


def test_an_htmx_poll_before_the_code_reloads_the_page_instead_of_swapping_in_the_form(approver):
    device_for(approver)
    client = Client()
    password(client, "acme-approver")
    response = client.get("/console/", headers={"HX-Request": "true"})
    assert response.status_code == 204 and response["HX-Refresh"] == "true"


@pytest.mark.parametrize(
    ("candidate", "code"),
    [("qwertyuiop", "password_too_common"), ("80417362951", "password_entirely_numeric")],
)
def test_common_and_numeric_passwords_are_refused(candidate, code, operator):
    with pytest.raises(ValidationError) as refused:
        validate_password(candidate, operator)
    assert code in [error.code for error in refused.value.error_list]


def test_an_operator_made_approver_while_signed_in_is_asked_at_the_next_request(acme, operator):
    client = Client()
    assert landed(password(client, "acme-operator")) == "/console/"
    grant_role(operator, acme, Role.APPROVER)
    response = client.get("/console/")
    assert response.status_code == 302 and response["Location"].startswith(CODE_PAGE)


def test_a_token_is_not_a_session_and_is_not_asked_for_a_code(approver):
    device_for(approver)
    session = Client()
    password(session, "acme-approver")
    assert session.get("/api/tasks/").status_code == 403
    _, key = token_create(approver, scopes=["read"], expires_at=timezone.now() + timedelta(hours=1))
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/tasks/").status_code == 200


def test_a_locked_out_session_on_the_code_page_is_signed_out_whatever_code_it_sends(approver):
    device = device_for(approver)
    client = Client()
    password(client, "acme-approver")
    for _ in range(5):  # five wrong passwords from elsewhere in the same address lock the pair
        Client().post(LOGIN, {"username": "acme-approver", "password": "guess"}, REMOTE_ADDR="10.0.0.1")
    response = give_code(client, code_for(device))
    assert response.status_code == 429 and b"acme-approver" in response.content
    assert "_auth_user_id" not in client.session
    assert not events(approver, Kind.SECOND_FACTOR_PASSED)


@pytest.mark.parametrize("page", [CODE_PAGE, ENROLL_PAGE])
def test_a_nul_in_a_code_is_refused_with_the_console_forms_message_and_counts_nothing(page, acme, approver):
    """The code forms are console forms too (``console.forms.ConsoleForm``): a NUL is named, where."""
    if page == CODE_PAGE:
        device_for(approver)
    client = Client()
    password(client, approver.get_username())
    response = client.post(page, {"code": "123\x00456"})
    assert response.status_code == 400
    assert "This text contains a NUL character (at position 3): remove it." in response.content.decode()
    assert events(approver, Kind.SECOND_FACTOR_FAILED) == []


def test_the_code_page_shows_an_invisible_character_typed_into_the_code(acme, approver):
    device_for(approver)
    client = Client()
    password(client, approver.get_username())
    page = give_code(client, "123\u202e456").content.decode()
    assert "\u202e" not in page and "⟨U+202E⟩" in page
