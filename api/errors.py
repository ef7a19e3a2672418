"""API error shape: transition refusals become 409s carrying the current state; refusals (403)
are recorded in the access log; field errors are a bounded list.

A body with thousands of wrong fields drew one message per field: 200,000 of them, 8.9 MB. An error
body holds at most ``MAX_ERRORS`` messages; where it stops, the object gets a ``"…"`` entry (a list,
a last item) saying how many more there were, and each message is cut at ``MAX_MESSAGE`` characters.
"""

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
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict | list):
        response.data = bounded(response.data)
    return response


MAX_ERRORS = 50
MAX_MESSAGE = 500
MORE = "…"


def bounded(detail: Any) -> Any:
    """``detail`` (DRF's errors: mappings, lists, messages) with at most ``MAX_ERRORS`` messages."""
    left = [MAX_ERRORS]

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            kept: dict[Any, Any] = {}
            for done, (key, item) in enumerate(value.items()):
                if left[0] <= 0:
                    kept[MORE] = f"and {len(value) - done} more"
                    break
                kept[key] = walk(item)
            return kept
        if isinstance(value, list):
            items: list[Any] = []
            for done, item in enumerate(value):
                if left[0] <= 0:
                    items.append(f"{MORE} and {len(value) - done} more")
                    break
                items.append(walk(item))
            return items
        left[0] -= 1
        if isinstance(value, str) and len(value) > MAX_MESSAGE:
            return f"{value[:MAX_MESSAGE]}{MORE}"
        return value

    return walk(detail)
