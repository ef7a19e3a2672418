from __future__ import annotations

from django.apps import AppConfig

from audit import sealing


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self) -> None:
        request = self.get_model("ApprovalRequest")
        # Its sealed copies of sensitive values (approvals.models): key rotation re-seals them too.
        sealing.register_json_column("approvals", request, "consequential")
        sealing.register_json_column("approval facts", request, "material")
