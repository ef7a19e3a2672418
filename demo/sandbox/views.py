"""The sandbox protocol over HTTP (DESIGN.md, "Operational contract").

- ``POST {base}/effects/`` + ``Idempotency-Key``: 201 with the new effect,
  200 with the first result when the key was seen before.
- ``GET {base}/effects/{key}``: 200 with the effect, 404 when absent.
- ``GET {base}/records/{id}``: a record with its ``version``;
  ``PUT`` replaces its data and bumps the version (tests and the demo use it
  to change facts under a waiting task).
- ``POST /sandbox/faults/``: queue a fault (see ``Fault``; ``params.key`` limits it to one
  key or record, ``params.standing`` keeps it until cleared);
  ``DELETE /sandbox/faults/`` clears them.
A fault can also be asked per call with the ``X-Sandbox-Fault`` header.
"""

from __future__ import annotations

import json
import time

from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from demo.sandbox.models import Effect, Fault, Record

SYSTEMS = ("payments", "tickets", "email", "orders")
HANG_SECONDS = 30  # longer than any connector timeout
FAULT_KINDS = ("latency", "timeout", "ambiguous", "error", "reject")


def _body(request: HttpRequest) -> dict | None:
    try:
        value = json.loads(request.body or b"{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _effect_json(effect: Effect) -> dict:
    return {
        "id": str(effect.pk),
        "idempotency_key": effect.idempotency_key,
        "status": effect.status,
        "record_version": effect.record_version,
        "request": effect.request,
        "deliveries": effect.deliveries,
        "created_at": effect.created_at.isoformat(),
    }


def _next_fault(request: HttpRequest, system: str, operation: str, key: str = "") -> tuple[str, dict] | None:
    """The fault this call suffers: the header's, or the oldest queued one that applies.

    A queued fault with ``params.key`` applies only to calls about that key (an
    idempotency key, or a record id for reads); one with ``params.standing`` is
    never used up (the demo's system that will not answer about one payment).
    """
    header = request.headers.get("X-Sandbox-Fault")
    if header:
        kind, _, value = header.partition("=")
        return kind, ({"ms": int(value)} if value.isascii() and value.isdigit() else {})
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


@csrf_exempt
@require_http_methods(["POST"])
def effects(request: HttpRequest, system: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    key = request.headers.get("Idempotency-Key", "").strip()
    body = _body(request)
    if not key or body is None:
        return JsonResponse(
            {"detail": "Idempotency-Key header and a JSON object body are required"}, status=400
        )
    fault = _next_fault(request, system, "dispatch", key)
    kind, params = fault or ("", {})
    if kind == "latency":
        time.sleep(params.get("ms", 500) / 1000)
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
    if kind == "timeout":
        time.sleep(params.get("seconds", HANG_SECONDS))  # committed; the caller gives up first
    if kind == "ambiguous":
        return JsonResponse({"detail": "injected: upstream answer lost"}, status=502)
    return JsonResponse(_effect_json(effect), status=201)


@csrf_exempt
@require_http_methods(["GET"])
def effect_detail(request: HttpRequest, system: str, key: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    fault = _next_fault(request, system, "lookup", key)
    if fault and fault[0] == "error":
        return JsonResponse({"detail": "injected error"}, status=503)
    effect = Effect.objects.filter(system=system, idempotency_key=key).first()
    if effect is None:
        return JsonResponse({"detail": "no effect with that key"}, status=404)
    return JsonResponse(_effect_json(effect))


@csrf_exempt
@require_http_methods(["GET", "PUT"])
def record(request: HttpRequest, system: str, record_id: str) -> JsonResponse:
    if missing := _unknown_system(system):
        return missing
    if request.method == "PUT":
        data = _body(request)
        if data is None:
            return JsonResponse({"detail": "a JSON object body is required"}, status=400)
        with transaction.atomic():
            found = Record.objects.select_for_update().filter(system=system, record_id=record_id).first()
            if found is None:
                found = Record.objects.create(system=system, record_id=record_id, data=data)
            else:
                found.data, found.version = data, found.version + 1
                found.save(update_fields=["data", "version", "updated_at"])
        return JsonResponse({"id": record_id, "version": found.version, "data": found.data})
    fault = _next_fault(request, system, "read", record_id)
    if fault and fault[0] == "error":
        return JsonResponse({"detail": "injected error"}, status=503)
    if fault and fault[0] == "latency":
        time.sleep(fault[1].get("ms", 500) / 1000)
    found = Record.objects.filter(system=system, record_id=record_id).first()
    if found is None:
        return JsonResponse({"detail": "no such record"}, status=404)
    return JsonResponse({"id": record_id, "version": found.version, "data": found.data})


@csrf_exempt
@require_http_methods(["POST", "DELETE"])
def faults(request: HttpRequest) -> JsonResponse:
    if request.method == "DELETE":
        Fault.objects.all().delete()
        return JsonResponse({"cleared": True})
    body = _body(request)
    remaining = body.get("remaining", 1) if body else None
    if (
        not body
        or body.get("system") not in SYSTEMS
        or body.get("kind") not in FAULT_KINDS
        or body.get("operation", "dispatch") not in ("dispatch", "lookup", "read")
        or not isinstance(body.get("params", {}), dict)
        or not isinstance(remaining, int)
        or isinstance(remaining, bool)
        or not 0 < remaining <= 10_000
    ):
        return JsonResponse(
            {"detail": f"system (one of {SYSTEMS}), kind (one of {FAULT_KINDS}) and a count are required"},
            status=400,
        )
    fault = Fault.objects.create(
        system=body["system"],
        operation=body.get("operation", "dispatch"),
        kind=body["kind"],
        remaining=remaining,
        params=body.get("params") or {},
    )
    return JsonResponse({"id": fault.pk, "queued": str(fault)}, status=201)
