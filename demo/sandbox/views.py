"""The sandbox protocol over HTTP (DESIGN.md, "Operational contract").

- ``POST {base}/effects/`` + ``Idempotency-Key``: 201 with the new effect,
  200 with the first result when the key was seen before.
- ``GET {base}/effects/{key}``: 200 with the effect, 404 when absent.
- ``GET {base}/effects/?since=<iso>[&after=<id>]``: the effects recorded at or
  after ``since``, oldest first, ``PAGE_SIZE`` a page: ``{"effects": [...],
  "next": <the last id, to pass as after, or null>}`` (recovery after a restore).
- ``GET {base}/records/{id}``: a record with its ``version``;
  ``PUT`` replaces its data and bumps the version (tests and the demo use it
  to change facts under a waiting task).
- ``POST /sandbox/faults/``: queue a fault (see ``Fault``; ``params.key`` limits it to one
  key or record, ``params.standing`` keeps it until cleared);
  ``DELETE /sandbox/faults/`` clears them.
A fault can also be asked per call with the ``X-Sandbox-Fault`` header (``kind`` or ``latency=<ms>``).

Served only when ``SANDBOX_ENABLED`` (config/urls.py), and then only to callers
that send ``Authorization: Bearer <SANDBOX_TOKEN>``: it performs "payments" and
lets anyone who reaches it plant faults, so reaching it is not enough (401).
One exception, for the evidence links on approval pages: a person signed in to
the console may read a record (``GET .../records/<id>``), nothing else.
Every control is checked before it is used: a fault that names an unknown
kind or parameter, or a latency that is not a whole number of milliseconds up
to ``MAX_LATENCY_MS``, is a 400 saying which, never a 500 or an unbounded sleep.
"""

from __future__ import annotations

import functools
import hmac
import json
import time
from collections.abc import Callable
from typing import Any, TypedDict, cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.utils.dateparse import parse_datetime
from django.views.decorators.csrf import csrf_exempt

from demo.sandbox.models import Effect, Fault, Record
from tasks import values

SYSTEMS = ("payments", "tickets", "email", "orders")
HANG_SECONDS = 30  # longer than any connector timeout
MAX_HANG_SECONDS = 30  # the most a timeout fault may hold a request (a server thread) hostage
DEFAULT_LATENCY_MS = 500
MAX_LATENCY_MS = 30_000  # a latency fault above this would just be a stuck thread
FAULT_KINDS = ("latency", "timeout", "ambiguous", "error", "reject")
OPERATIONS = ("dispatch", "lookup", "read")
PAGE_SIZE = 500


class BadFault(ValueError):
    """A fault control the sandbox will not apply; the message says which part and why."""


class FaultParams(TypedDict, total=False):
    """A fault's ``params``, every one optional (``clean_params`` checks them)."""

    ms: int
    seconds: float
    key: str
    standing: bool


class FaultFields(TypedDict):
    """The fields of a ``Fault`` to create, as ``clean_fault`` checked them."""

    system: str
    kind: str
    operation: str
    remaining: int
    params: FaultParams


class EffectJson(TypedDict):
    """An effect as the sandbox answers it."""

    id: str
    idempotency_key: str
    status: str
    record_version: int
    request: dict[str, Any]
    deliveries: int
    created_at: str


View = Callable[..., JsonResponse]


def sandbox_view(*methods: str, people_may_read: bool = False) -> Callable[[View], View]:
    """A sandbox endpoint: no CSRF (its callers are systems), the bearer token, then the methods.

    ``people_may_read``: a GET from a signed-in console user needs no token (approvers open records).
    """

    def decorate(view: View) -> View:
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            reader = people_may_read and request.method == "GET" and request.user.is_authenticated
            if not (reader or _authorized(request)):
                response = JsonResponse(
                    {"detail": "the sandbox needs Authorization: Bearer <SANDBOX_TOKEN>"}, status=401
                )
                response["WWW-Authenticate"] = 'Bearer realm="sandbox"'
                return response
            if request.method not in methods:
                response = JsonResponse({"detail": f"{request.method} is not allowed here"}, status=405)
                response["Allow"] = ", ".join(methods)
                return response
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def _authorized(request: HttpRequest) -> bool:
    expected = settings.SANDBOX_TOKEN
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    # An empty token never matches: a sandbox without one configured answers nobody.
    return bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), expected)


def _body(request: HttpRequest) -> tuple[dict[str, Any] | None, str]:
    """The JSON object sent, or None and why not (not JSON, not an object, not storable)."""
    try:
        value = json.loads(request.body or b"{}")
    except ValueError:
        return None, "the body is not JSON"
    if not isinstance(value, dict):
        return None, "the body is not a JSON object"
    try:
        values.check(value, "body")
    except values.Unstorable as exc:
        return None, f"{exc}, which the sandbox cannot store"
    return value, ""


def _latency_ms(value: Any) -> int:
    """A latency in whole milliseconds, 0..MAX_LATENCY_MS (from a fault's params or its header)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LATENCY_MS:
        raise BadFault(f"latency ms must be a whole number of milliseconds from 0 to {MAX_LATENCY_MS}")
    return value


def clean_params(kind: str, params: Any) -> FaultParams:
    """A queued fault's ``params``, checked: ``ms`` (latency), ``seconds`` (timeout), ``key``,
    ``standing`` (see ``Fault``)."""
    if not isinstance(params, dict):
        raise BadFault("params must be a JSON object")
    unknown = sorted(set(params) - {"ms", "seconds", "key", "standing"})
    if unknown:
        raise BadFault(f"unknown params {unknown}: ms, seconds, key and standing are known")
    cleaned = cast(FaultParams, dict(params))  # its keys are the known ones, their values checked below
    if "ms" in params:
        if kind != "latency":
            raise BadFault("params.ms applies to latency faults only")
        cleaned["ms"] = _latency_ms(params["ms"])
    if "seconds" in params:
        seconds = params["seconds"]
        if kind != "timeout":
            raise BadFault("params.seconds applies to timeout faults only")
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not 0 <= seconds <= MAX_HANG_SECONDS
        ):
            raise BadFault(f"params.seconds must be a number from 0 to {MAX_HANG_SECONDS}")
    if "key" in params and not (isinstance(params["key"], str) and 0 < len(params["key"]) <= 200):
        raise BadFault("params.key must be a non-empty string of at most 200 characters")
    if "standing" in params and not isinstance(params["standing"], bool):
        raise BadFault("params.standing must be true or false")
    return cleaned


def _header_fault(header: str) -> tuple[str, FaultParams]:
    """``X-Sandbox-Fault: <kind>`` or ``latency=<ms>``, checked like a queued fault."""
    kind, has_value, value = header.strip().partition("=")
    if kind not in FAULT_KINDS:
        raise BadFault(f"X-Sandbox-Fault names no fault kind (one of {', '.join(FAULT_KINDS)})")
    if not has_value:
        return kind, {}
    if kind != "latency":
        raise BadFault("X-Sandbox-Fault takes a value (=ms) for latency only")
    return kind, {"ms": _latency_ms(value)}


def _effect_json(effect: Effect) -> EffectJson:
    return {
        "id": str(effect.pk),
        "idempotency_key": effect.idempotency_key,
        "status": effect.status,
        "record_version": effect.record_version,
        "request": effect.request,
        "deliveries": effect.deliveries,
        "created_at": effect.created_at.isoformat(),
    }


def _next_fault(
    request: HttpRequest, system: str, operation: str, key: str = ""
) -> tuple[str, FaultParams] | None:
    """The fault this call suffers: the header's, or the oldest queued one that applies.

    A queued fault with ``params.key`` applies only to calls about that key (an
    idempotency key, or a record id for reads); one with ``params.standing`` is
    never used up (the demo's system that will not answer about one payment).
    Raises ``BadFault`` for a header it cannot apply.
    """
    header = request.headers.get("X-Sandbox-Fault")
    if header:
        return _header_fault(header)
    with transaction.atomic():
        queued = (
            Fault.objects.select_for_update()
            .filter(system=system, operation=operation, remaining__gt=0)
            .order_by("id")
        )
        fault = next((f for f in queued if f.params.get("key") in (None, key)), None)
        if fault is None:
            return None
        if not fault.params.get("standing"):
            Fault.objects.filter(pk=fault.pk).update(remaining=fault.remaining - 1)
    return fault.kind, fault.params


def _unknown_system(system: str) -> JsonResponse | None:
    if system not in SYSTEMS:
        return JsonResponse({"detail": f"no system {system!r}"}, status=404)
    return None


def _sleep_ms(params: FaultParams) -> None:
    # Queued faults were checked when queued; the cap is applied again for rows written by other means.
    time.sleep(min(params.get("ms", DEFAULT_LATENCY_MS), MAX_LATENCY_MS) / 1000)


def _refused(exc: BadFault) -> JsonResponse:
    return JsonResponse({"detail": str(exc)}, status=400)


@sandbox_view("GET", "POST")
def effects(request: HttpRequest, system: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    if request.method == "GET":
        return _listing(request, system)
    key = request.headers.get("Idempotency-Key", "").strip()
    if not key or len(key) > 200 or values.text_problem(key):
        return JsonResponse(
            {"detail": "an Idempotency-Key header (at most 200 characters) is required"}, status=400
        )
    # An empty body is refused, not read as {}: a sender killed after its headers went out leaves one
    # (Content-Length said more), and no system performs an effect nobody described.
    body, problem = _body(request) if request.body else (None, "the body is empty")
    if body is None:
        return JsonResponse({"detail": f"a JSON object body is required: {problem}"}, status=400)
    try:
        fault = _next_fault(request, system, "dispatch", key)
    except BadFault as exc:
        return _refused(exc)
    kind, params = fault or ("", {})
    if kind == "latency":
        _sleep_ms(params)
    # A key seen before gets its first result, whatever else this call was meant to suffer.
    existing = Effect.objects.filter(system=system, idempotency_key=key).first()
    if existing is not None:
        Effect.objects.filter(pk=existing.pk).update(deliveries=F("deliveries") + 1)
        return JsonResponse(_effect_json(existing), status=200)
    if kind == "error":
        return JsonResponse({"detail": "injected error: nothing was done"}, status=503)
    if kind == "reject":
        return JsonResponse({"detail": "injected rejection", "status": "rejected"}, status=422)
    try:
        with transaction.atomic():
            effect = Effect.objects.create(system=system, idempotency_key=key, request=body)
    except IntegrityError:
        Effect.objects.filter(system=system, idempotency_key=key).update(deliveries=F("deliveries") + 1)
        return JsonResponse(_effect_json(Effect.objects.get(system=system, idempotency_key=key)), status=200)
    if kind == "timeout":  # committed; the caller gives up first
        time.sleep(min(params.get("seconds", HANG_SECONDS), MAX_HANG_SECONDS))
    if kind == "ambiguous":
        return JsonResponse({"detail": "injected: upstream answer lost"}, status=502)
    return JsonResponse(_effect_json(effect), status=201)


def _listing(request: HttpRequest, system: str) -> JsonResponse:
    """The effects recorded at or after ``since``, a page after ``after`` (an effect id)."""
    try:
        since = parse_datetime(request.GET.get("since", ""))
    except ValueError:  # well formed, not a time (a 13th month)
        since = None
    if since is None or since.tzinfo is None:
        return JsonResponse({"detail": "since must be an ISO 8601 time with its offset"}, status=400)
    after = request.GET.get("after", "0")
    if not (after.isascii() and after.isdigit()):
        return JsonResponse({"detail": "after must be an effect id (a whole number)"}, status=400)
    page = list(
        Effect.objects.filter(system=system, created_at__gte=since, pk__gt=int(after)).order_by("pk")[
            : PAGE_SIZE + 1
        ]
    )
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    return JsonResponse(
        {"effects": [_effect_json(e) for e in page], "next": str(page[-1].pk) if more else None}
    )


@sandbox_view("GET")
def effect_detail(request: HttpRequest, system: str, key: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    try:
        fault = _next_fault(request, system, "lookup", key)
    except BadFault as exc:
        return _refused(exc)
    if fault and fault[0] == "error":
        return JsonResponse({"detail": "injected error"}, status=503)
    effect = Effect.objects.filter(system=system, idempotency_key=key).first()
    if effect is None:
        return JsonResponse({"detail": "no effect with that key"}, status=404)
    return JsonResponse(_effect_json(effect))


@sandbox_view("GET", "PUT", people_may_read=True)
def record(request: HttpRequest, system: str, record_id: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    if request.method == "PUT":
        data, problem = _body(request)
        if data is None:
            return JsonResponse({"detail": f"a JSON object body is required: {problem}"}, status=400)
        with transaction.atomic():
            found = Record.objects.select_for_update().filter(system=system, record_id=record_id).first()
            if found is None:
                found = Record.objects.create(system=system, record_id=record_id, data=data)
            else:
                found.data, found.version = data, found.version + 1
                found.save(update_fields=["data", "version", "updated_at"])
        return JsonResponse({"id": record_id, "version": found.version, "data": found.data})
    try:
        fault = _next_fault(request, system, "read", record_id)
    except BadFault as exc:
        return _refused(exc)
    if fault and fault[0] == "error":
        return JsonResponse({"detail": "injected error"}, status=503)
    if fault and fault[0] == "latency":
        _sleep_ms(fault[1])
    found = Record.objects.filter(system=system, record_id=record_id).first()
    if found is None:
        return JsonResponse({"detail": "no such record"}, status=404)
    return JsonResponse({"id": record_id, "version": found.version, "data": found.data})


@sandbox_view("POST", "DELETE")
def faults(request: HttpRequest) -> JsonResponse:
    if request.method == "DELETE":
        Fault.objects.all().delete()
        return JsonResponse({"cleared": True})
    body, problem = _body(request)
    if body is None:
        return JsonResponse({"detail": f"a JSON object body is required: {problem}"}, status=400)
    try:
        fields = clean_fault(body)
    except BadFault as exc:
        return _refused(exc)
    fault = Fault.objects.create(**fields)
    return JsonResponse({"id": fault.pk, "queued": str(fault)}, status=201)


def clean_fault(body: dict[str, Any]) -> FaultFields:
    """The fields of a ``Fault`` from a request body, every part checked (``BadFault`` says which)."""
    unknown = sorted(set(body) - {"system", "kind", "operation", "remaining", "params"})
    if unknown:
        raise BadFault(f"unknown fields {unknown}: system, kind, operation, remaining and params are known")
    if body.get("system") not in SYSTEMS:
        raise BadFault(f"system must be one of {', '.join(SYSTEMS)}")
    if body.get("kind") not in FAULT_KINDS:
        raise BadFault(f"kind must be one of {', '.join(FAULT_KINDS)}")
    operation = body.get("operation", "dispatch")
    if operation not in OPERATIONS:
        raise BadFault(f"operation must be one of {', '.join(OPERATIONS)}")
    remaining = body.get("remaining", 1)
    if not isinstance(remaining, int) or isinstance(remaining, bool) or not 0 < remaining <= 10_000:
        raise BadFault("remaining must be a whole number from 1 to 10000")
    params = clean_params(body["kind"], body.get("params") or {})
    return {
        "system": body["system"],
        "kind": body["kind"],
        "operation": operation,
        "remaining": remaining,
        "params": params,
    }
