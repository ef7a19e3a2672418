"""POST /api/tasks/{id}/fork/ — resume an ended task from one of its checkpoints as a new task."""

from __future__ import annotations

import functools
from typing import Any
from uuid import UUID

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import TaskDetail, storable
from api.views.tasks import MAX_VERSION, TaskRerunApi, _started
from reads import visibility
from tasks import forks
from tasks.selectors import roles_in
from tasks.states import ActorKind
from tasks.transitions import Actor
from tenancy.models import Role, Scope

# How each refusal of ``tasks.forks`` answers: no such version is a 404, a field the type keeps is the
# caller's input (400), a task that cannot be forked now is a conflict with its state (409).
REFUSAL_STATUS = {
    forks.ForkRefused.NOT_FOUND: status.HTTP_404_NOT_FOUND,
    forks.ForkRefused.NOT_EDITABLE: status.HTTP_400_BAD_REQUEST,
    forks.ForkRefused.NOT_FORKABLE: status.HTTP_409_CONFLICT,
}

REFUSED = inline_serializer(
    "ForkRefused", {"detail": serializers.CharField(), "code": serializers.CharField()}
)


class TaskForkApi(APIView):
    """Start a new task from checkpoint ``version`` of an ended task (``tasks.forks``).

    The new task is linked to the original (``rerun_of``) and starts at that checkpoint's step with its
    facts and evidence; input fields the task type names in ``fork_editable`` may be changed in
    ``input``. It carries no approvals and no ledger: every approval is asked again, and an effect the
    original completed is reused, never sent twice. Both histories record the fork.
    """

    token_scopes = {"POST": Scope.OPERATE}

    # A rerun's fields (reason, idempotency key, deadline and their checks), plus where to resume and
    # what to change. No docstring: drf-spectacular would publish it as the schema's description.
    class ForkInput(TaskRerunApi.RerunInput):
        version = serializers.IntegerField(
            min_value=1, max_value=MAX_VERSION, help_text="The checkpoint version to resume from"
        )
        input = serializers.JSONField(
            required=False, help_text="New values of the input fields the task type lets a fork change"
        )

        def validate_input(self, value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise serializers.ValidationError("Expected a JSON object.")
            storable(value)
            return value

    @extend_schema(
        operation_id="tasks_fork",
        request=ForkInput,
        responses={
            200: OpenApiResponse(TaskDetail, description="Same idempotency key: the fork started before"),
            201: TaskDetail,
            400: OpenApiResponse(
                description="Field errors; input_not_editable: a field the task type keeps as submitted"
            ),
            403: OpenApiResponse(description="Needs the operator or admin role in the task's tenant"),
            404: OpenApiResponse(REFUSED, description="checkpoint_not_found: no checkpoint at that version"),
            409: OpenApiResponse(
                REFUSED,
                description="not_forkable: the task has not ended (or is a compensation run); "
                "checkpoint_*: the checkpoint fails verification (altered); idempotency_conflict",
            ),
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        roles = roles_in(request.user, task)
        if not roles & {Role.OPERATOR, Role.ADMIN}:
            raise PermissionDenied(
                "Resuming a task from a checkpoint needs the operator or admin role in its tenant."
            )
        body = self.ForkInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        kind = ActorKind.OPERATOR if Role.OPERATOR in roles else ActorKind.ADMIN
        start = functools.partial(
            forks.task_fork,
            task,
            actor=Actor.user(request.user, kind),
            version=data.pop("version"),
            input_changes=data.pop("input", None),
            **data,
        )
        try:
            return _started(request, start)
        except forks.ForkRefused as exc:
            return Response({"detail": str(exc), "code": exc.code}, status=REFUSAL_STATUS[exc.code])
