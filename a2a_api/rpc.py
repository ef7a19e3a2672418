"""The JSON-RPC 2.0 plumbing of the A2A surface: what a method handler receives, how it refuses, and the
one table of methods (``METHODS``) that ``POST /a2a/`` dispatches on.

A handler takes a ``Call`` and returns either the JSON-RPC ``result`` (a dict, usually
``json_format.MessageToDict`` of an ``a2a_pb2`` message) or, for a streaming method, a response
(server-sent events) that the view passes through as it is. It refuses by raising ``RpcError``; the view
turns that into the JSON-RPC error object. Modules that serve methods register them with ``@method``
and are imported by ``a2a_api.methods`` (or, the streaming ones, ``a2a_api.views``) so the table is
whole before the first request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from django.http import HttpRequest
from django.http.response import HttpResponseBase


class Code(IntEnum):
    """JSON-RPC 2.0's standard codes and A2A v1.0's own (the a2a-sdk's ``a2a.utils.errors`` table)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOTIFICATION_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005
    INVALID_AGENT_RESPONSE = -32006
    EXTENDED_AGENT_CARD_NOT_CONFIGURED = -32007
    EXTENSION_SUPPORT_REQUIRED = -32008
    VERSION_NOT_SUPPORTED = -32009


ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "a2a-protocol.org"


class RpcError(Exception):
    """A refusal the caller is told about as a JSON-RPC error. ``data`` names what was wrong (a field,
    our state, a reason code) so a calling agent can act on it without parsing the message.

    On the wire ``error.data`` is what A2A v1.0 and the a2a-sdk's client read: a list holding one
    ``google.rpc.ErrorInfo``-shaped object, ``{"@type": ERROR_INFO_TYPE, "reason": <the code's name,
    e.g. TASK_NOT_FOUND>, "domain": "a2a-protocol.org", "metadata": <data>}``; the SDK's client raises
    the code's error class with ``metadata`` as its ``.data`` (``error.data["field"]``)."""

    def __init__(self, code: Code, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}

    def as_error(self) -> dict[str, Any]:
        info = {
            "@type": ERROR_INFO_TYPE,
            "reason": self.code.name,
            "domain": ERROR_DOMAIN,
            "metadata": self.data,
        }
        return {"code": int(self.code), "message": self.message, "data": [info]}


def error_metadata(error: dict[str, Any]) -> dict[str, Any]:
    """The ``metadata`` of a JSON-RPC error object's ErrorInfo (what ``RpcError.data`` was); {} if none."""
    for item in error.get("data") or []:
        if isinstance(item, dict) and item.get("@type") == ERROR_INFO_TYPE:
            return dict(item.get("metadata") or {})
    return {}


@dataclass
class Call:
    """One JSON-RPC request, authenticated: ``user`` is the token's user, ``token`` the
    ``tenancy.ApiToken`` (None for a console session, which the A2A surface does not accept today)."""

    request: HttpRequest
    id: str | int | None
    method: str
    params: dict[str, Any]
    user: Any
    token: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[Call], "dict[str, Any] | HttpResponseBase"]
METHODS: dict[str, Handler] = {}


def method(name: str) -> Callable[[Handler], Handler]:
    """Register ``handler`` as the A2A method ``name`` (a v1.0 name such as ``GetTask``)."""

    def register(handler: Handler) -> Handler:
        if name in METHODS:
            raise ValueError(f"A2A method {name} registered twice")
        METHODS[name] = handler
        return handler

    return register
