"""API error shape: transition refusals become 409s carrying the current state; refusals (403)
are recorded in the access log."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import TaskNotFound, TransitionError
from tenancy.models import AccessEvent
from tenancy.services import record_access


def _record_forbidden(exc: Exception, context: dict[str, Any]) -> None:
    request = context.get("request")
    if request is None:
        return
    reason = str(getattr(exc, "detail", "") or exc)
    record_access(
        AccessEvent.Kind.FORBIDDEN, user=request.user, request=request, detail=f"{request.method} {reason}"
    )


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, PermissionDenied | DjangoPermissionDenied):
        _record_forbidden(exc, context)
    if isinstance(exc, TaskNotFound):
        return Response({"detail": "Not found.", "code": exc.code}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, CheckpointUnreadable):
        # The task cannot be moved from what it stored; a worker will quarantine it.
        return Response(
            {"detail": f"The task's checkpoint cannot be read: {exc.detail}", "code": exc.reason},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, TransitionError):
        return Response(
            {"detail": str(exc), "code": exc.code, "state": exc.state, "state_version": exc.state_version},
            status=status.HTTP_409_CONFLICT,
        )
    return drf_exception_handler(exc, context)
