"""The A2A v1.0 surface: the agent card and ``POST /a2a/``, the JSON-RPC 2.0 endpoint.

Thin: the request is checked in the order a caller can act on (size, JSON, the JSON-RPC envelope, the
``A2A-Version`` header, the token and its ``integrate`` scope, the method, values PostgreSQL cannot
hold), then one handler from ``rpc.METHODS`` runs. Every refusal is a JSON-RPC error object; an
unexpected exception is logged and answered ``-32603`` with no detail, never a 500 page. A streaming
method (``a2a_api.stream``) answers with its server-sent events response, passed through as it is;
whatever it refuses before the stream starts is a JSON-RPC error like any other.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.http.request import RawPostDataException
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from google.protobuf import json_format
from rest_framework.exceptions import Throttled

from a2a_api import methods, push_methods, stream  # noqa: F401  (register the methods: rpc.METHODS is whole from here)
from a2a_api.card import PROTOCOL_VERSION, agent_card
from a2a_api.rpc import METHODS, Call, Code, RpcError
from config import outage
from config.throttling import WrongTokenThrottle
from tasks import values
from tenancy.models import Scope
from tenancy.services import TokenRefused, token_authenticate

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = frozenset({PROTOCOL_VERSION})
BEARER_WORDS = ("bearer", "token")


@require_GET
def agent_card_view(request: HttpRequest) -> HttpResponse:
    """GET /.well-known/agent-card.json — the public card (every task type as a skill)."""
    response = JsonResponse(json_format.MessageToDict(agent_card()))
    response["Cache-Control"] = "public, max-age=60"
    return response


def _answer(request_id: Any, *, result: Any = None, error: RpcError | None = None) -> JsonResponse:
    """The JSON-RPC answer; an error may carry its HTTP status and ``Retry-After`` (popped from its data)."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    status, retry_after = 200, None
    if error is not None:
        status = int(error.data.pop("http_status", 200))
        retry_after = error.data.pop("retry_after", None)
        body["error"] = error.as_error()
    else:
        body["result"] = result
    response = JsonResponse(body, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _read_body(request: HttpRequest) -> bytes:
    """The body, at most ``A2A_MAX_MESSAGE_BYTES``: a larger one is refused before it is read whole."""
    limit = settings.A2A_MAX_MESSAGE_BYTES
    too_big = RpcError(
        Code.INVALID_REQUEST,
        f"The request body is larger than {limit} bytes (A2A_MAX_MESSAGE_BYTES).",
        {"limit_bytes": limit},
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise too_big
    try:
        body = request.read(limit + 1)
    except RawPostDataException:  # read already (a middleware): take what it read
        body = request.body
    if len(body) > limit:
        raise too_big
    return body


def _envelope(body: bytes) -> tuple[Any, str, dict[str, Any]]:
    """(id, method, params) of a JSON-RPC 2.0 request, or the error that names what is wrong."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RpcError(Code.PARSE_ERROR, "The body is not JSON (UTF-8).") from None
    if not isinstance(data, dict):
        raise RpcError(
            Code.INVALID_REQUEST, "A JSON-RPC request is one JSON object (batches are not served)."
        )
    request_id = data.get("id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        raise RpcError(Code.INVALID_REQUEST, '"id" must be a string or an integer.', {"field": "id"})
    if data.get("jsonrpc") != "2.0":
        raise _WithId(
            request_id, RpcError(Code.INVALID_REQUEST, '"jsonrpc" must be "2.0".', {"field": "jsonrpc"})
        )
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise _WithId(
            request_id, RpcError(Code.INVALID_REQUEST, '"method" must be a string.', {"field": "method"})
        )
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise _WithId(
            request_id, RpcError(Code.INVALID_PARAMS, '"params" must be an object.', {"field": "params"})
        )
    return request_id, method, params


class _WithId(Exception):
    """A refusal found once the request's id was known (the error answer then carries it)."""

    def __init__(self, request_id: Any, error: RpcError) -> None:
        super().__init__(error.message)
        self.request_id = request_id
        self.error = error


def _authenticate(request: HttpRequest) -> Any:
    """The caller's ``ApiToken`` (with its user), which must hold the ``integrate`` scope."""
    words = request.headers.get("Authorization", "").split()
    if len(words) != 2 or words[0].lower() not in BEARER_WORDS:
        raise RpcError(
            Code.INVALID_REQUEST,
            "Authentication needed: Authorization: Bearer <API token>.",
            {"http_status": 401},
        )
    # Wrong keys are counted per address with the REST API's (one budget, whichever surface guesses).
    throttle = WrongTokenThrottle()
    try:
        throttle.count_attempt(request)
    except Throttled:
        raise RpcError(
            Code.INVALID_REQUEST,
            "Too many wrong tokens from this address; try again later.",
            {"http_status": 429, "retry_after": int(throttle.wait() or 1)},
        ) from None
    try:
        token = token_authenticate(words[1])
    except TokenRefused as exc:
        raise RpcError(Code.INVALID_REQUEST, str(exc), {"http_status": 401}) from None
    throttle.right_key()
    if Scope.INTEGRATE not in token.scope_set:
        raise RpcError(Code.INVALID_REQUEST, "This token needs the 'integrate' scope.", {"http_status": 403})
    return token


@csrf_exempt
@require_POST
def rpc_view(request: HttpRequest) -> HttpResponseBase:
    """POST /a2a/ — one JSON-RPC 2.0 request of A2A v1.0."""
    request_id: Any = None
    try:
        request_id, method_name, params = _envelope(_read_body(request))
        version = request.headers.get("A2A-Version", "").strip()
        if version not in SUPPORTED_VERSIONS:
            raise RpcError(
                Code.VERSION_NOT_SUPPORTED,
                f"A2A-Version {version or '(none: 0.3)'} is not served; send A2A-Version: 1.0.",
                {"supported": sorted(SUPPORTED_VERSIONS)},
            )
        token = _authenticate(request)
        handler = METHODS.get(method_name)
        if handler is None:
            raise RpcError(
                Code.METHOD_NOT_FOUND, f"No method {method_name!r} (A2A v1.0 names, e.g. SendMessage)."
            )
        try:
            values.check(params, "params")
        except values.Unstorable as exc:
            raise RpcError(Code.INVALID_PARAMS, str(exc), {"field": exc.where}) from None
        call = Call(
            request=request, id=request_id, method=method_name, params=params, user=token.user, token=token
        )
        outcome = handler(call)
    except _WithId as refused:
        return _answer(refused.request_id, error=refused.error)
    except RpcError as error:
        return _answer(request_id, error=error)
    except Exception as exc:
        reason = outage.outage_reason(exc)
        if reason:  # a failover or restart: try again shortly (503, Retry-After), nothing was half written
            return outage.unavailable(request, reason, rpc_id=request_id)
        logger.exception("A2A request failed", extra={"rpc_id": str(request_id)})
        return _answer(request_id, error=RpcError(Code.INTERNAL_ERROR, "Internal error (logged)."))
    if isinstance(outcome, HttpResponseBase):  # a stream (StreamingHttpResponse)
        return outcome
    return _answer(request_id, result=outcome)
