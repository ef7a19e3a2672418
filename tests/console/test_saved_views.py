"""Saved views: a user's named queue filters, saved and deleted with plain POSTs (no JavaScript)."""

from __future__ import annotations

import pytest
from django.test import Client

from console.saved_views import QUEUE_KEYS
from tenancy import services
from tenancy.models import SavedView

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_saving_keeps_only_the_queues_filters_and_lists_the_view_as_a_link(operator):
    client = client_for(operator)
    response = client.post(
        "/console/views/",
        {"name": "  Stuck   refunds ", "query": "state=ready&stuck=true&before=abc&evil=1&sort=age&q="},
    )
    view = SavedView.objects.get(user=operator)
    assert view.name == "Stuck refunds"
    assert view.query == "state=ready&stuck=true&sort=age"
    assert response.status_code == 302 and response["Location"] == f"/console/?{view.query}"

    page = client.get("/console/").content.decode()
    assert 'href="?state=ready&amp;stuck=true&amp;sort=age"' in page
    assert "Stuck refunds" in page


def test_the_query_is_re_encoded_so_a_link_cannot_break_out():
    cleaned = services.clean_query('state="><script>x</script>&region=eu west', QUEUE_KEYS)
    assert "<" not in cleaned and '"' not in cleaned and " " not in cleaned


def test_a_name_is_unique_per_user_and_refused_with_a_message(operator, auditor):
    client = client_for(operator)
    client.post("/console/views/", {"name": "Mine", "query": "state=ready"})
    response = client.post("/console/views/", {"name": "Mine", "query": "state=failed"}, follow=True)
    assert "already have a view named" in response.content.decode()
    assert SavedView.objects.get(user=operator, name="Mine").query == "state=ready"
    # Another user may use the same name.
    client_for(auditor).post("/console/views/", {"name": "Mine", "query": "state=failed"})
    assert SavedView.objects.filter(name="Mine").count() == 2


@pytest.mark.parametrize(
    ("name", "query", "message"),
    [
        ("", "state=ready", "Give the view a name"),
        ("x" * 81, "state=ready", "at most 80"),
        ("long", "q=" + "a" * 2000, "too long"),
    ],
)
def test_bad_input_is_refused_and_nothing_saved(operator, name, query, message):
    response = client_for(operator).post("/console/views/", {"name": name, "query": query}, follow=True)
    assert message in response.content.decode()
    assert not SavedView.objects.exists()


def test_saving_needs_a_post_with_the_csrf_token(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get("/console/views/").status_code == 405
    assert client.post("/console/views/", {"name": "x", "query": ""}).status_code == 403
    assert not SavedView.objects.exists()


def test_deleting_asks_first_then_deletes_only_the_owners_view(operator, auditor):
    view = services.saved_view_create(operator, name="Doomed", query="state=ready", allowed_keys=QUEUE_KEYS)
    # Someone else's view: 404 whether confirmed or not.
    assert (
        client_for(auditor).post(f"/console/views/{view.pk}/delete/", {"confirm": "yes"}).status_code == 404
    )
    client = client_for(operator)
    asked = client.post(f"/console/views/{view.pk}/delete/")
    assert asked.status_code == 200
    assert "Delete the saved view “Doomed”?" in asked.content.decode()
    assert SavedView.objects.filter(pk=view.pk).exists()
    done = client.post(f"/console/views/{view.pk}/delete/", {"confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == "/console/"
    assert not SavedView.objects.filter(pk=view.pk).exists()


def test_a_user_has_a_bounded_number_of_views(operator):
    for n in range(services.SAVED_VIEWS_MAX):
        services.saved_view_create(operator, name=f"v{n}", query="", allowed_keys=QUEUE_KEYS)
    with pytest.raises(services.SavedViewRefused, match="delete one first"):
        services.saved_view_create(operator, name="one more", query="", allowed_keys=QUEUE_KEYS)


# --- views shared with a tenant -------------------------------------------------------------------


def test_an_operator_shares_a_view_with_the_tenant_and_its_members_see_it_but_no_one_else(
    operator, auditor, outsider, acme
):
    saved = client_for(operator).post(
        "/console/views/", {"name": "Refunds over a day", "query": "state=ready&age=1d", "share": "acme"}
    )
    assert saved.status_code == 302
    view = SavedView.objects.get()
    assert (view.tenant, view.user) == (acme, operator)

    seen = client_for(auditor).get("/console/")
    assert view in seen.context["saved_views"] and view.pk not in seen.context["deletable_views"]
    page = seen.content.decode()
    assert "Refunds over a day" in page and "shared · acme" in page
    assert f"/console/views/{view.pk}/delete/" not in page  # the auditor may not delete it
    assert client_for(outsider).get("/console/").context["saved_views"] == []


def test_only_operators_and_admins_share_and_only_with_their_own_tenants(auditor, operator, globex, acme):
    refused = client_for(auditor).post("/console/views/", {"name": "Mine", "query": "", "share": "acme"})
    assert refused.status_code == 302  # back to the queue with the message
    assert not SavedView.objects.exists()
    with pytest.raises(services.SavedViewRefused, match="Only the operators and admins of acme"):
        services.saved_view_create(auditor, name="Mine", query="", allowed_keys=QUEUE_KEYS, tenant=acme)
    with pytest.raises(services.SavedViewRefused, match="Only the operators and admins of globex"):
        services.saved_view_create(operator, name="Theirs", query="", allowed_keys=QUEUE_KEYS, tenant=globex)
    client_for(operator).post("/console/views/", {"name": "Theirs", "query": "", "share": "globex"})
    assert not SavedView.objects.exists()  # a tenant the operator holds no role in reads as unknown


def test_a_shared_name_is_unique_in_the_tenant_and_apart_from_personal_names(operator, admin_user, acme):
    services.saved_view_create(
        operator, name="Stuck", query="stuck=true", allowed_keys=QUEUE_KEYS, tenant=acme
    )
    with pytest.raises(services.SavedViewRefused, match="acme has a view named “Stuck” already"):
        services.saved_view_create(admin_user, name="Stuck", query="", allowed_keys=QUEUE_KEYS, tenant=acme)
    services.saved_view_create(
        operator, name="Stuck", query="stuck=true", allowed_keys=QUEUE_KEYS
    )  # personal
    assert SavedView.objects.filter(name="Stuck").count() == 2


def test_a_shared_view_is_deleted_by_its_author_or_the_tenants_admin_only(
    operator, auditor, admin_user, acme
):
    def share(name: str) -> SavedView:
        return services.saved_view_create(operator, name=name, query="", allowed_keys=QUEUE_KEYS, tenant=acme)

    first, second = share("one"), share("two")
    assert client_for(auditor).post(f"/console/views/{first.pk}/delete/", {"confirm": "1"}).status_code == 404
    assert not services.saved_view_delete(auditor, first.pk)
    assert (
        client_for(admin_user).post(f"/console/views/{first.pk}/delete/", {"confirm": "1"}).status_code == 302
    )
    assert services.saved_view_delete(operator, second.pk)
    assert not SavedView.objects.exists()
