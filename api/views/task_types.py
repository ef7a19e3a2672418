"""``GET /api/task-types/`` and ``GET /api/task-types/{name}/``: what a caller can start, as a contract.

The JSON twin of ``/console/task-types/`` and the source of the A2A agent card's skills: each answer is
``reads.task_types.TaskTypeContract`` serialized (name, description, the input's JSON Schema with
sensitive fields marked, steps, approvals and their money limits, ``version``). Task types are the
deployment's: anyone holding a role in some tenant reads all of them (``task_types.visible_to``);
a caller with no role lists none, and every name answers them 404. A token needs the ``read`` scope.

The list is every registered type in one page (a handful, fixed by the code that runs): it has the
envelope of the API's other lists, with ``next`` and ``previous`` always null.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import TaskTypeOut
from reads import task_types
from tasks import registry

TASK_TYPE_PAGE = inline_serializer(
    "TaskTypePage",
    {
        "next": serializers.CharField(allow_null=True, help_text="Always null: every type is on this page"),
        "previous": serializers.CharField(allow_null=True, help_text="Always null"),
        "results": TaskTypeOut(many=True),
    },
)


class TaskTypeListApi(APIView):
    @extend_schema(operation_id="task_types_list", responses={200: TASK_TYPE_PAGE})
    def get(self, request: Request) -> Response:
        """Every task type the caller may start, by name (none for a caller with no role)."""
        shown = task_types.contracts() if task_types.visible_to(request.user) else []
        # arg-type: the stubs let a plain Serializer take one instance only, not many=True's list.
        results = TaskTypeOut(shown, many=True).data  # type: ignore[arg-type]
        return Response({"next": None, "previous": None, "results": results})


class TaskTypeDetailApi(APIView):
    @extend_schema(
        operation_id="task_types_retrieve",
        parameters=[OpenApiParameter("task_type", str, OpenApiParameter.PATH, enum=registry.names())],
        responses={200: TaskTypeOut, 404: OpenApiResponse(description="No such type (or no role to see it)")},
    )
    def get(self, request: Request, task_type: str) -> Response:
        """One task type's contract; its ``version`` changes whenever anything else in it does."""
        contract = task_types.contract(task_type) if task_types.visible_to(request.user) else None
        if contract is None:
            raise NotFound("No such task type.")
        return Response(TaskTypeOut(contract).data)
