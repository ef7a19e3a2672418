"""API authentication and token scopes.

``Authorization: Token <key>`` (or ``Bearer <key>``) names an ``ApiToken``;
only its SHA-256 is stored (``tenancy.services.token_authenticate``). An
unknown, revoked or expired key answers 401, and wrong keys are counted per
address: past the anonymous rate, that address gets 429 even for a right key,
so keys cannot be guessed at speed.

What a token may do is the intersection of its scopes and its user's roles:
``TokenScopes`` checks the scope an endpoint declares for the method
(``token_scopes`` on the view; safe methods need ``read``), and the view checks
the roles as it does for everyone. A console session is held to roles only.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from config.throttling import WrongTokenThrottle
from tenancy.models import ApiToken, Scope
from tenancy.services import TokenRefused, token_authenticate

KEYWORDS = ("token", "bearer")


class ApiTokenAuthentication(BaseAuthentication):
    """``Authorization: Token <key>`` or ``Bearer <key>`` → (user, ApiToken); no header → not this scheme."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        words = get_authorization_header(request).split()
        if not words or words[0].lower().decode("latin-1") not in KEYWORDS:
            return None
        if len(words) != 2:
            raise AuthenticationFailed("Invalid token header: give one key after the word Token.")
        throttle = WrongTokenThrottle()
        throttle.count_attempt(request)
        try:
            token = token_authenticate(words[1].decode("ascii"))
        except (UnicodeDecodeError, TokenRefused) as exc:
            message = str(exc) if isinstance(exc, TokenRefused) else "Invalid token."
            raise AuthenticationFailed(message) from None
        throttle.right_key()
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return "Token"


def required_scope(view: Any, method: str) -> str | None:
    """The scope a token needs for ``method`` on ``view``: what the view declares in ``token_scopes``,
    else ``read`` for safe methods; None (no token may) for an undeclared write."""
    declared: dict[str, str] = getattr(view, "token_scopes", {})
    if method in declared:
        return declared[method]
    return Scope.READ if method in SAFE_METHODS else None


class TokenScopes(BasePermission):
    """A token-authenticated request needs the scope its endpoint declares for the method."""

    message = "This token's scopes do not allow this."

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth
        if not isinstance(token, ApiToken):
            return True  # a session: the view's role checks decide alone
        needed = required_scope(view, request.method or "")
        if needed is None:
            self.message = "No token scope allows this; use a console session."
            return False
        if needed not in token.scope_set:
            self.message = f"This needs a token with the {needed!r} scope."
            return False
        return True


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI document describes the token header (drf-spectacular finds it by ``target_class``)."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'A token from `manage.py drf_create_token`, as "Token <key>" or "Bearer <key>"',
        }
