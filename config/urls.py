from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from a2a_api.views import agent_card_view, rpc_view
from api.views.schema import SchemaApi
from config import metrics
from console import second_factor
from console.views import ConsoleLogin

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),
    path("admin/", admin.site.urls),
    path("accounts/login/", ConsoleLogin.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # After the password, approvers and admins give a code (tenancy/second_factor.py).
    path("accounts/second-factor/", second_factor.code, name="second-factor"),
    path("accounts/second-factor/enroll/", second_factor.enroll, name="second-factor-enroll"),
    path("api/schema/", SchemaApi.as_view(), name="api-schema"),  # built once per process
    path("api/", include("api.urls")),
    path("console/", include("console.urls")),
    # A2A v1.0: the agent card and the JSON-RPC endpoint it names (a2a_api/views.py).
    path(".well-known/agent-card.json", agent_card_view, name="a2a-agent-card"),
    path("a2a/", rpc_view, name="a2a-rpc"),
    # Prometheus scrapes (a token or an allowed network: config/metrics.py). /healthz and /readyz are
    # answered by config.health.HealthMiddleware before the URL conf.
    path("metrics", metrics.metrics_view, name="metrics"),
]

# The console's 403 page, recorded in the access log (API refusals are recorded by api.errors).
handler403 = "console.access_log.forbidden"
# A database outage met before the view (session, user, second factor) answers 503, not 500.
handler500 = "config.outage.server_error"

if settings.SANDBOX_ENABLED:
    urlpatterns.append(path("sandbox/", include("demo.sandbox.urls")))
